"""Errors of the renderer: one a unit can cause, one the deployment causes."""

from __future__ import annotations


class RenderError(ValueError):
    """This candidate cannot be drawn (bad LaTeX, malformed table HTML, nothing to draw).

    A scorer turns it into verdict `render_failed` for that unit only."""


class FontNotFoundError(RuntimeError):
    """The configured font file is missing: a deployment error, raised at scorer start."""
