"""The base every configuration model derives from: typed, documented, unknown keys rejected."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """A frozen pydantic model that rejects keys it does not know (a typo is an error, not a no-op)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)
