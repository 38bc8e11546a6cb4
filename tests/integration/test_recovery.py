"""Recovery with the real fleet and nothing but its workers: a worker's main process SIGKILLed
mid-page, a message put back at the head of its queue, a Redis that lost its messages, a
submit while the broker was down, the sweepers' election."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest
import redis
from sqlalchemy import text

from ocrfleet import client
from ocrfleet.db.session import get_engine
from ocrfleet.service import Context
from ocrfleet.service import ingest as ingest_in_process
from ocrfleet.tasks import routing
from ocrfleet.tasks.app import create_app
from ocrfleet.tasks.sweeper import LOCK_KEY, LOSS_WAIT_PERIODS, Sweeper
from ocrfleet.tasks.sweeps import (
    expire_page_images,
    ingest_intake,
    message_refs,
    referenced,
    requeue_lost,
)
from ocrfleet.tasks.worker import connect
from tests.conftest import free_port
from tests.integration.fleet_helpers import (
    Workers,
    assert_written_once,
    make_document,
    queue_depths,
    rows,
    scalar,
    settings_from,
    start_workers,
    wait_finished,
)

pytestmark = pytest.mark.integration

HOOKS = "tests.integration.fleet_hooks"


def with_default_limits(env: dict[str, str]) -> dict[str, str]:
    """The fleet's own defaults for time limits and visibility timeout (an hour)."""
    drop = ("OCRFLEET_TASK_SOFT_TIME_LIMIT", "OCRFLEET_TASK_TIME_LIMIT")
    drop += ("OCRFLEET_VISIBILITY_TIMEOUT",)
    return {key: value for key, value in env.items() if key not in drop}


def test_main_process_killed_mid_page_everything_completes_within_two_minutes(
    env: dict[str, str], tmp_path: Path, started: list[Workers]
) -> None:
    kill_dir = tmp_path / "kills"
    kill_dir.mkdir()
    env = {**with_default_limits(env), "FLEET_KILL_DIR": str(kill_dir)}
    settings = settings_from(env)
    assert settings.visibility_timeout == 3600  # kombu alone would wait an hour
    url = env["OCRFLEET_DATABASE_URL"]

    blobs = [make_document(800 + i, 3) for i in range(4)]
    victim = hashlib.sha256(blobs[1]).hexdigest()
    (kill_dir / f"crash-{victim}-2").touch()

    workers = start_workers(env, tmp_path / "workers.log", devices="cpu:2", include=[HOOKS])
    started.append(workers)
    ids = [client.submit(blob, settings=settings) for blob in blobs]
    record = kill_dir / f"killed-crash-{victim}-2"
    deadline = time.monotonic() + 300
    while not record.exists():
        assert time.monotonic() < deadline, workers.log_tail()
        time.sleep(0.2)
    killed_at = time.monotonic()
    # The page's message is stranded in `unacked` by the dead main process.
    conn = redis.Redis.from_url(env["OCRFLEET_BROKER_URL"])
    time.sleep(1)
    assert conn.hlen("unacked") >= 1

    states = wait_finished(ids, settings, timeout=120, workers=workers)
    print(f"every document finished {time.monotonic() - killed_at:.1f}s after the kill")
    # No `ocrfleet beat`: the launcher's sweeper was elected and requeued the message.
    assert conn.get(LOCK_KEY) is not None

    assert [s.status.value for s in states] == ["done"] * 4, [s.reason for s in states]
    assert_written_once(url)
    crashed = scalar(
        url,
        "SELECT p.deliveries FROM pages p JOIN documents d ON d.id = p.document_id "
        "WHERE d.sha256 = :sha AND p.number = 2",
        sha=victim,
    )
    assert crashed == 2  # the delivery count was kept across the requeue
    assert "requeued orphaned message" in workers.log_tail(500_000)


def test_a_message_put_back_by_a_worker_goes_to_the_head_of_its_queue(
    env: dict[str, str],
) -> None:
    """What a pool process killed mid-page causes (`task_reject_on_worker_lost`): the
    consumer rejects the message with requeue, and it must run next, not after the backlog."""
    settings = settings_from(env)
    app = create_app(settings)
    connect(app, settings)  # what `celery --app ocrfleet.tasks.worker` does
    conn = redis.Redis.from_url(env["OCRFLEET_BROKER_URL"])
    for page_id in (1, 2, 3):
        app.send_task(routing.PAGE_TASK, args=[page_id], queue="gpu")
    with app.connection_for_read() as connection:
        queue = app.amqp.queues["gpu"](connection.default_channel)
        message = queue.get(no_ack=False)  # taken from the head: the oldest
        assert message is not None and message.decode()[0] == [1]  # (args, kwargs, embed)
        assert conn.hlen("unacked") == 1
        message.reject(requeue=True)
    assert conn.hlen("unacked") == 0
    queued = [json.loads(raw) for raw in conn.lrange("gpu", 0, -1)]
    # The head is the right end (workers BRPOP): page 1 is next again, redelivered.
    assert [message_refs(m)[1] for m in queued] == [3, 2, 1]
    assert queued[-1]["headers"]["redelivered"] is True


def test_one_sweeper_is_elected_and_a_broker_that_lost_its_data_is_swept_at_once(
    env: dict[str, str], tmp_path: Path
) -> None:
    settings = settings_from(env)  # sweep_lost_after_s: the default two minutes
    conn = redis.Redis.from_url(env["OCRFLEET_BROKER_URL"])
    first, second = Sweeper(settings), Sweeper(settings)
    try:
        assert set(first.tick()) == {"orphans", "lost", "retention"}  # all due at start
        assert second.tick() == {} and (first.held, second.held) == (True, False)
        assert first.tick() == {}  # nothing due again within its period

        # Pending pages with no message, younger than sweep_lost_after_s: left alone...
        source = tmp_path / "split.pdf"
        source.write_bytes(make_document(870, 2))
        outcome = ingest_in_process(Context(settings), str(source))
        assert first.tick() == {}
        # ...until the broker loses its data (the lock with it): the next sweeper to take
        # the lock notices the epoch marker is gone and re-sends them once the workers
        # have had the time to say what they hold.
        conn.flushdb()
        assert second.tick()["lost"] == {"pages": [], "documents": []}  # the age rule
        assert second.held
        later = time.time() + LOSS_WAIT_PERIODS * settings.heartbeat_interval_s
        swept = second.tick(now=later)
        assert sorted(swept["lost"]["pages"]) == sorted(outcome.page_ids)
        assert queue_depths(env["OCRFLEET_BROKER_URL"])["gpu"] == 2
        assert first.tick() == {} and not first.held
    finally:
        first.stop()
        second.stop()
    assert conn.get(LOCK_KEY) is None  # released on stop: a standby takes over at once


def test_lost_messages_and_a_submit_while_the_broker_was_down_are_requeued(
    env: dict[str, str], tmp_path: Path, started: list[Workers]
) -> None:
    env = {**env, "OCRFLEET_SWEEP_LOST_AFTER_S": "1"}
    settings = settings_from(env)
    broker = env["OCRFLEET_BROKER_URL"]
    conn = redis.Redis.from_url(broker)

    # A document split in-process (rows and page images, no message): as after Redis
    # lost its page messages.
    split_blob = make_document(850, 2)
    source = tmp_path / "split.pdf"
    source.write_bytes(split_blob)
    outcome = ingest_in_process(Context(settings), str(source))
    # A document submitted normally, whose ingest message Redis then lost.
    lost_doc = client.submit(make_document(851, 2), settings=settings)
    conn.flushdb()
    # A document submitted while the broker was down: a clear error, the row stays pending.
    down = settings.model_copy(update={"broker_url": f"redis://127.0.0.1:{free_port()}/0"})
    with pytest.raises(client.BrokerUnavailable, match="recovery sweep enqueues it"):
        client.submit(make_document(852, 1), settings=down)
    ((down_doc,),) = rows(
        env["OCRFLEET_DATABASE_URL"],
        "SELECT id FROM documents WHERE status = 'pending' AND id <> :d",
        d=lost_doc,
    )

    # Something already waits in the page queue: the requeued pages go before it.
    busy = client.submit(make_document(853, 1), settings=settings)
    time.sleep(1.5)  # older than sweep_lost_after_s
    assert referenced(conn) == (set(), {busy})
    requeued = requeue_lost(settings)
    assert sorted(requeued["pages"]) == sorted(outcome.page_ids)
    assert sorted(requeued["documents"]) == sorted([lost_doc, down_doc])
    assert requeue_lost(settings) == {"pages": [], "documents": []}  # nothing twice
    # The head of a queue is its right end (workers BRPOP): the requeued go first.
    ingest = [message_refs(json.loads(raw))[1] for raw in conn.lrange("ingest", 0, -1)]
    assert ingest[0] == busy and sorted(ingest[1:]) == sorted([lost_doc, down_doc])
    assert queue_depths(broker)["gpu"] == 2

    workers = start_workers(env, tmp_path / "workers.log", devices="cpu:1")
    started.append(workers)
    ids = [outcome.document_id, lost_doc, down_doc, busy]
    states = wait_finished(ids, settings, timeout=300, workers=workers)
    assert [s.status.value for s in states] == ["done"] * 4, [s.reason for s in states]
    assert_written_once(env["OCRFLEET_DATABASE_URL"])


def test_intake_objects_are_submitted_once_and_old_page_images_expire(
    env: dict[str, str], tmp_path: Path
) -> None:
    intake = tmp_path / "intake"
    intake.mkdir()
    (intake / "a.pdf").write_bytes(make_document(860, 1))
    (intake / "b.pdf").write_bytes(make_document(861, 1))
    settings = settings_from({**env, "OCRFLEET_INTAKE_PREFIX": f"file://{intake}"})
    submitted = ingest_intake(settings)
    assert len(submitted) == 2
    assert queue_depths(env["OCRFLEET_BROKER_URL"])["ingest"] == 2
    assert ingest_intake(settings) == []  # once
    (intake / "c.pdf").write_bytes(make_document(862, 1))
    assert len(ingest_intake(settings)) == 1

    # A document finished 31 days ago loses its derived page images; a fresh one keeps them.
    source = tmp_path / "old.pdf"
    source.write_bytes(make_document(863, 2))
    old = ingest_in_process(Context(settings), str(source))
    source.write_bytes(make_document(864, 1))
    fresh = ingest_in_process(Context(settings), str(source))
    url = env["OCRFLEET_DATABASE_URL"]
    with get_engine(url).begin() as conn:
        conn.execute(
            text(
                "UPDATE documents SET status = 'done', "
                "updated_at = now() - interval '31 days' WHERE id = :d"
            ),
            {"d": old.document_id},
        )
        conn.execute(
            text("UPDATE documents SET status = 'done' WHERE id = :d"), {"d": fresh.document_id}
        )
    store = Context(settings).store
    query = "SELECT image_uri FROM pages WHERE document_id = :d"
    images = {
        doc: [store.key_of(uri) for (uri,) in rows(url, query, d=doc)]
        for doc in (old.document_id, fresh.document_id)
    }
    assert expire_page_images(settings) == 2
    assert not any(store.exists(key) for key in images[old.document_id])
    assert all(store.exists(key) for key in images[fresh.document_id])
    assert expire_page_images(settings) == 0
