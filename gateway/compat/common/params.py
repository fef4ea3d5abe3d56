"""Query parameters of the SDK protocols' listing calls (Tinker's and Weaver's pages)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query

Limit = Annotated[int, Query(ge=1, le=1000, description="Items in the page")]
Offset = Annotated[int, Query(ge=0, description="Items skipped before the page")]
