"""ocrfleet: a distributed OCR worker fleet with per-region verification and review routing."""

__version__ = "0.1.0"
