"""The classification extension: replace an output with its top-N ``"value:index[:label]"`` strings (spec §1.7)."""

from __future__ import annotations

import numpy as np


def _fmt(value: object) -> str:
    # Triton formats with C++ std::to_string: floats get six decimals, integers none.
    if isinstance(value, float | np.floating):
        return f"{float(value):.6f}"
    return str(int(value))  # type: ignore[call-overload]


def classify(array: np.ndarray, count: int, labels: list[str] | None, batching: bool) -> np.ndarray:
    """Top-``count`` per batch row (batching models) or over the whole tensor, as a BYTES array."""
    rows = array.reshape(array.shape[0], -1) if batching and array.ndim > 0 else array.reshape(1, -1)
    k = min(count, rows.shape[1])
    out = np.empty((rows.shape[0], k), dtype=np.object_)
    for r, row in enumerate(rows):
        # stable sort on the negated values: ties keep the lower index first, as std::sort on pairs does
        order = np.argsort(-row.astype(np.float64), kind="stable")[:k]
        for j, idx in enumerate(order):
            text = f"{_fmt(row[idx].item())}:{idx}"
            if labels is not None and idx < len(labels):
                text += f":{labels[idx]}"
            out[r, j] = text.encode()
    return out if batching else out.reshape(k)
