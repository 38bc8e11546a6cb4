"""Pages/s and peak GPU memory of layout + MiniCPM-OCR + Jev on one CUDA device, at two
batch sizes (run by bench/gpu_check.sh once per device, with CUDA_VISIBLE_DEVICES set).

    python bench/gpu_pages.py --pages 8 --batch-sizes 4,16
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.corpus import real_pages  # noqa: E402
from ocrfleet.config import Settings  # noqa: E402
from ocrfleet.pipeline.page import process_png  # noqa: E402
from ocrfleet.tasks.startup import startup_check  # noqa: E402
from ocrfleet.toolkit import load_toolkit  # noqa: E402


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=8)
    parser.add_argument("--batch-sizes", default="4,16")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    args = parser.parse_args()
    base = Settings(engines=["minicpm"], scorer="jev", layout="rapid", minicpm_device="cuda",
                    jev_device="cuda", minicpm_max_new_tokens=args.max_new_tokens)
    pages = real_pages(base, args.pages)
    name = torch.cuda.get_device_name(0)
    for batch_size in [int(b) for b in args.batch_sizes.split(",")]:
        settings = base.model_copy(
            update={"minicpm_batch_size": batch_size, "jev_batch_size": batch_size}
        )
        toolkit = load_toolkit(settings)
        startup_check(toolkit)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        regions = 0
        start = time.perf_counter()
        for number, data in enumerate(pages, start=1):
            regions += len(process_png(number, data, toolkit).result.regions)
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        peak = torch.cuda.max_memory_allocated() / 2**30
        print(
            f"device {name} batch {batch_size}: {len(pages) / elapsed:.3f} pages/s, "
            f"{regions / elapsed:.1f} regions/s, peak memory {peak:.2f} GiB "
            f"({len(pages)} pages, {regions} regions)",
            flush=True,
        )
        del toolkit
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
