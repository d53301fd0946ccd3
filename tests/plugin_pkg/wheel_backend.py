"""A minimal PEP 517 build backend: builds a pure-Python wheel from pyproject.toml.

Only what the plug-in test needs (``build_wheel``): the modules listed under
``[tool.wheel_backend]``, METADATA, WHEEL, entry_points.txt and RECORD. It needs nothing
but the standard library, so ``pip install --no-build-isolation`` works offline.
"""

from __future__ import annotations

import base64
import hashlib
import re
import tomllib
import zipfile
from pathlib import Path

_HERE = Path(__file__).resolve().parent


def _project() -> tuple[dict, list[str]]:
    data = tomllib.loads((_HERE / "pyproject.toml").read_text())
    return data["project"], data["tool"]["wheel_backend"]["modules"]


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    project, modules = _project()
    dist = re.sub(r"[-_.]+", "_", project["name"]).lower()
    version = project["version"]
    info = f"{dist}-{version}.dist-info"
    files: dict[str, bytes] = {m: (_HERE / m).read_bytes() for m in modules}
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {version}\n"
        f"Summary: {project.get('description', '')}\n"
    ).encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: wheel_backend\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    groups = project.get("entry-points", {})
    files[f"{info}/entry_points.txt"] = "".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n"
        for group, eps in groups.items()
    ).encode()
    record = [_record_line(name, data) for name, data in files.items()]
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()

    filename = f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(Path(wheel_directory) / filename, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return filename
