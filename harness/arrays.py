"""Typed numpy arrays for annotations (numpy.typing), by element type."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
ObjectArray = npt.NDArray[np.object_]  # strings and None, as pandas' object columns hold them
StrArray = npt.NDArray[np.str_]
AnyArray = npt.NDArray[np.generic]  # an array of any element type
