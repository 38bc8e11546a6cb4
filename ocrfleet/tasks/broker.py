"""kombu's Redis transport, except that a message put back by a worker goes to the head of
its queue.

A consumer rejects a message with `requeue=True` when its pool process died on it
(`task_reject_on_worker_lost`: a killed or OOM-killed child, the hard time limit) and when it
cannot record a failure (`FleetTask`: the database is down). kombu puts such a message at
the tail (`LPUSH`), behind every page queued meanwhile: a page whose pool process was killed
with 30 pages queued waited 169-195 s to run again. Here it goes to the head (`RPUSH`:
workers take from the right with `BRPOP`), as kombu's own restore of unacknowledged messages
and the orphan sweep do, and in the same kombu priority sub-list it came from.
"""

from __future__ import annotations

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual

TRANSPORT = "ocrfleet.tasks.broker:Transport"


class QoS(kombu_redis.QoS):
    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if not requeue:
            super().reject(delivery_tag, requeue=False)
            return
        # One transaction moves it from `unacked` back to the head of its list...
        self.restore_by_tag(delivery_tag, leftmost=False)
        # ...then forget it locally, as kombu's reject does (the indices are already clean).
        virtual.QoS.ack(self, delivery_tag)


class Channel(kombu_redis.Channel):
    QoS = QoS


class Transport(kombu_redis.Transport):
    Channel = Channel
