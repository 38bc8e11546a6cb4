"""The one settings object. Every knob comes from `OCRFLEET_*` variables or `.env`.

Defaults are the embedded mode: SQLite, a local store directory, in-process execution and
the CPU engine, so `ocrfleet run` works on a fresh machine with nothing else running.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

CommaList = Annotated[list[str], NoDecode]

# Default auto-accept thresholds per scorer. Consensus scores are calibrated on synthetic
# lines and pile up near 1 for good text: 0.998 keeps accepted text >= 99% exact on the
# synthetic held-out set (bench/scorer_auroc.py). Jev's is its softmax decision boundary.
SCORER_THRESHOLDS = {"consensus": 0.998, "jev": 0.5}


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
    jev_model_path: Path | None = None
    dpi: int = Field(200, ge=36, le=600)
    rec_batch_size: int = Field(16, ge=1)
    tesseract_lang: str = Field("eng", description="tesseract -l value, e.g. eng or eng+chi_sim")
    # Unset: the scorer's own default (SCORER_THRESHOLDS); set one from `ocrfleet thresholds`.
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

    # Fleet behaviour.
    max_deliveries: int = Field(3, ge=1, description="a page delivered more often is failed")
    task_soft_time_limit: int = Field(600, ge=1)
    task_time_limit: int = Field(900, ge=1)
    visibility_timeout: int = Field(3600, ge=1)
    worker_max_tasks: int = Field(500, ge=1)
    worker_max_memory_mb: int = Field(8192, ge=64)
    onnx_threads: int | None = Field(
        None, ge=1, description="onnxruntime intra-op threads for RapidOCR; unset: its default"
    )

    # Layout, MiniCPM-OCR and the engine chain (issue 10). All enter run_id.
    # Default lines: rapid's block order reads examples/letter.pdf at CER 0.117 and UNLV
    # 8087 at 0.0885 (lines: <= 0.05 and 0.0746), though it passes 13/13 olmOCR order checks.
    layout: Literal["rapid", "lines"] = Field(
        "lines", description="rapid: layout blocks with categories; lines: text lines only"
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

    @field_validator("engines", mode="before")
    @classmethod
    def _split_commas(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("engines")
    @classmethod
    def _known_engines(cls, value: list[str]) -> list[str]:
        known = {"rapidocr", "tesseract", "minicpm"}
        unknown = [name for name in value if name not in known]
        if unknown or not value:
            raise ValueError(f"engines must be a non-empty subset of {sorted(known)}: {value}")
        return value

    def threshold(self, category: str) -> float:
        """The effective auto-accept threshold: the setting, else the scorer's default."""
        from ocrfleet.ir import Category

        value = getattr(self, f"threshold_{Category(category).scored_as.value}")
        return float(SCORER_THRESHOLDS[self.scorer] if value is None else value)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings; tests build their own `Settings(...)` instead."""
    return Settings()
