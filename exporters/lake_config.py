"""The lake's settings: where it is kept, how parts are cut, and where sealed parts are shipped."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from aaco.contract.stores import StoreError, check_url, is_remote, local_path
from aaco.exporters.context import ExporterSettings
from aaco.exporters.lake_ship import UploadSettings

# A URL that went through a Path keeps one slash after its scheme (Path("s3://b/p") is "s3:/b/p").
# file:/dir is a URL of its own (no authority) and stays as it is.
_ONE_SLASH = re.compile(r"^(?![Ff][Ii][Ll][Ee]:)([A-Za-z][A-Za-z0-9+.-]*):/(?!/)")


def _checked(url: str) -> str:
    """``check_url`` with its error as the ValueError pydantic reports under the field."""
    try:
        return check_url(url)
    except StoreError as exc:
        raise ValueError(str(exc)) from None


def _url_text(value: object) -> str | None:
    """``value`` as URL text when it is a string or path, its scheme's two slashes restored."""
    if not isinstance(value, (str, Path)):
        return None
    return _ONE_SLASH.sub(r"\1://", str(value), count=1)


class LakeConfig(ExporterSettings):
    """The Parquet lake: kept locally, and shipped to object storage when ``remote`` (or a URL ``path``) says so."""

    section = "lake"
    summary = "Parquet lake (local, optionally shipped to object storage)."

    enabled: bool = Field(True, description="Write the lake.")
    path: Path = Field(
        Path("aaco-data"),
        description="Local lake directory (created if missing); an object store URL here (s3://BUCKET/PREFIX, "
        "gs://, abfs://) means remote=URL with the local copy in ./aaco-data.",
    )
    remote: str | None = Field(
        None,
        description="Object store URL every sealed part is shipped to, exactly once (s3://BUCKET/PREFIX, gs://, "
        "abfs://, file://); the connection from AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID/SECRET or upload.",
    )
    upload: UploadSettings = Field(default_factory=UploadSettings, description="Shipping to the remote store.")
    flush_rows: PositiveInt = Field(200_000, description="Write a part when a partition buffers this many rows.")
    flush_interval_s: PositiveFloat = Field(10.0, description="Write buffered rows at least this often.")
    compression: str = Field("zstd", description="Parquet compression codec.")

    @model_validator(mode="before")
    @classmethod
    def _split_url(cls, data: Any) -> Any:
        """A ``file://`` path is its directory; another URL in ``path`` moves to ``remote``; unknown schemes fail."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        text = _url_text(data.get("path"))
        if text is not None and is_remote(text):
            if data.get("remote") not in (None, text):
                raise ValueError(f"path {text} and remote {data['remote']}: give the URL once (remote)")
            data["remote"] = _checked(text)
            data.pop("path")
        elif text is not None:
            data["path"] = local_path(_checked(text))
        remote = _url_text(data.get("remote"))
        if remote is not None:
            data["remote"] = _checked(remote)
        return data
