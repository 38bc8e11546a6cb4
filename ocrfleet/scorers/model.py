"""The consensus scorer's fitted model as plain arrays: gradient-boosted trees (exported from
scikit-learn's HistGradientBoostingClassifier at training time) and their calibration.
Scoring is numpy only, so a worker never imports scikit-learn and a batch of regions
costs a handful of vector operations: all trees advance one level per step together. A Platt
map fitted on held-back predictions turns the trees' log-odds into a probability.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Trees:
    """All trees' nodes in one table; tree t starts at node `roots[t]`. A leaf's `value` is
    its raw (log-odds) contribution; an inner node sends x[feature] <= threshold left, and a
    missing value (NaN) the way `missing_left` says."""

    baseline: float
    roots: np.ndarray  # int64 (n_trees,)
    feature: np.ndarray  # int64 (n_nodes,)
    threshold: np.ndarray  # float64
    left: np.ndarray  # int64, absolute node index
    right: np.ndarray  # int64
    missing_left: np.ndarray  # bool
    is_leaf: np.ndarray  # bool
    value: np.ndarray  # float64
    depth: int

    def raw(self, x: np.ndarray) -> np.ndarray:
        """Log-odds per row of `x` (n, n_features)."""
        x = np.atleast_2d(np.asarray(x, dtype=np.float64))
        rows = np.arange(x.shape[0])[:, None]
        node = np.broadcast_to(self.roots, (x.shape[0], self.roots.size)).copy()
        for _ in range(self.depth):
            leaf = self.is_leaf[node]
            if leaf.all():
                break
            values = x[rows, self.feature[node]]
            go_left = np.where(
                np.isnan(values), self.missing_left[node], values <= self.threshold[node]
            )
            node = np.where(leaf, node, np.where(go_left, self.left[node], self.right[node]))
        return self.baseline + self.value[node].sum(axis=1)

    def upper_raw(self, x: np.ndarray, free: np.ndarray) -> np.ndarray:
        """The highest log-odds any row of `x` can reach when the features marked in `free`
        (bool, per feature or per row and feature) may take any value, NaN included: where
        a node splits on a free feature, its best is the better child's. The others decide
        as in `raw`, so with nothing free this is `raw`. Exact per tree, summed over trees:
        an upper bound."""
        return self._bound(x, free, np.maximum)

    def lower_raw(self, x: np.ndarray, free: np.ndarray) -> np.ndarray:
        """The lowest log-odds any row of `x` can reach when the features in `free` may
        take any value: `upper_raw` with the worse child. A lower bound."""
        return self._bound(x, free, np.minimum)

    def _bound(self, x: np.ndarray, free: np.ndarray, pick) -> np.ndarray:
        x = np.atleast_2d(np.asarray(x, dtype=np.float64))
        free = np.broadcast_to(np.asarray(free, dtype=bool), x.shape)
        leaves = np.where(self.is_leaf, self.value, np.nan)
        best = np.broadcast_to(leaves, (x.shape[0], leaves.size)).copy()
        for nodes in reversed(self._inner_by_level()):
            left, right, feature = self.left[nodes], self.right[nodes], self.feature[nodes]
            values = x[:, feature]
            go_left = np.where(
                np.isnan(values), self.missing_left[nodes], values <= self.threshold[nodes]
            )
            follow = np.where(go_left, best[:, left], best[:, right])
            either = pick(best[:, left], best[:, right])
            best[:, nodes] = np.where(free[:, feature], either, follow)
        return self.baseline + best[:, self.roots].sum(axis=1)

    def _inner_by_level(self) -> list[np.ndarray]:
        """Inner nodes grouped by depth from their tree's root (root level first)."""
        levels: list[np.ndarray] = []
        current = self.roots
        while current.size:
            inner = current[~self.is_leaf[current]]
            if inner.size:
                levels.append(inner)
            current = np.concatenate([self.left[inner], self.right[inner]])
        return levels

    def to_json(self) -> dict[str, Any]:
        return {
            "baseline": _num(self.baseline),
            "roots": self.roots.tolist(),
            "feature": self.feature.tolist(),
            "threshold": [_num(v) for v in self.threshold],
            "left": self.left.tolist(),
            "right": self.right.tolist(),
            "missing_left": self.missing_left.astype(int).tolist(),
            "is_leaf": self.is_leaf.astype(int).tolist(),
            "value": [_num(v) for v in self.value],
            "depth": self.depth,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Trees:
        return cls(
            baseline=float(raw["baseline"]),
            roots=np.array(raw["roots"], dtype=np.int64),
            feature=np.array(raw["feature"], dtype=np.int64),
            threshold=np.array(raw["threshold"], dtype=np.float64),
            left=np.array(raw["left"], dtype=np.int64),
            right=np.array(raw["right"], dtype=np.int64),
            missing_left=np.array(raw["missing_left"], dtype=bool),
            is_leaf=np.array(raw["is_leaf"], dtype=bool),
            value=np.array(raw["value"], dtype=np.float64),
            depth=int(raw["depth"]),
        )


def trees_from_sklearn(model: Any) -> Trees:
    """Export a fitted binary HistGradientBoostingClassifier (numerical features only)."""
    roots, feature, threshold, left, right, missing, leaf, value = ([] for _ in range(8))
    depth = 0
    offset = 0
    for iteration in model._predictors:  # noqa: SLF001 - the fitted trees live here
        (predictor,) = iteration
        nodes = predictor.nodes
        roots.append(offset)
        feature.extend(int(v) for v in nodes["feature_idx"])
        threshold.extend(float(v) for v in nodes["num_threshold"])
        left.extend(int(v) + offset for v in nodes["left"])
        right.extend(int(v) + offset for v in nodes["right"])
        missing.extend(bool(v) for v in nodes["missing_go_to_left"])
        leaf.extend(bool(v) for v in nodes["is_leaf"])
        value.extend(float(v) for v in nodes["value"])
        depth = max(depth, int(nodes["depth"].max()))
        offset += len(nodes)
    baseline = float(np.ravel(model._baseline_prediction)[0])  # noqa: SLF001
    return Trees(
        baseline=baseline,
        roots=np.array(roots, dtype=np.int64),
        feature=np.array(feature, dtype=np.int64),
        threshold=np.array(threshold, dtype=np.float64),
        left=np.array(left, dtype=np.int64),
        right=np.array(right, dtype=np.int64),
        missing_left=np.array(missing, dtype=bool),
        is_leaf=np.array(leaf, dtype=bool),
        value=np.array(value, dtype=np.float64),
        depth=depth + 1,
    )


@dataclass(frozen=True)
class Platt:
    """Log-odds to probability, sigmoid(slope * raw + intercept), fitted on held-back
    predictions. Strictly increasing, so a threshold on the probability is as fine as one
    on the log-odds (an isotonic map's flat steps would lump hundreds of candidates into
    one threshold)."""

    slope: float
    intercept: float

    def __call__(self, raw: np.ndarray) -> np.ndarray:
        z = np.clip(self.slope * np.asarray(raw, dtype=np.float64) + self.intercept, -50, 50)
        return 1.0 / (1.0 + np.exp(-z))

    def to_json(self) -> dict[str, Any]:
        return {"slope": _num(self.slope), "intercept": _num(self.intercept)}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Platt:
        slope = float(raw["slope"])
        if not slope > 0:
            raise ValueError(f"a Platt map must increase; slope {slope}")
        return cls(slope, float(raw["intercept"]))


def _num(value: float) -> float:
    return round(float(value), 10) + 0.0
