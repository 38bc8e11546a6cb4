"""The HTTP API for upload services (`ocrfleet api`): submit, status, results, cancel."""

from ocrfleet.api.app import create_app

__all__ = ["create_app"]
