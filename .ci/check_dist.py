"""The built wheel and sdist carry what users rely on: py.typed, the licence, its metadata.

    python .ci/check_dist.py dist/       # after `python -m build -o dist .` and `twine check`
"""

import email
import pathlib
import sys
import tarfile
import zipfile

import chunkx


def main(dist: pathlib.Path) -> None:
    (wheel,), (sdist,) = dist.glob("chunkx-*.whl"), dist.glob("chunkx-*.tar.gz")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        meta = email.message_from_bytes(z.read(f"{info}/METADATA"))
    problems = [f"{wheel.name}: no {p}" for p in ("chunkx/py.typed", f"{info}/licenses/LICENSE")
                if p not in names]
    expected = {"License-Expression": "Apache-2.0", "License-File": "LICENSE",
                "Version": chunkx.__version__, "Author": "chunkx developers"}
    problems += [f"{wheel.name}: {k} is {meta[k]!r}, expected {v!r}"
                 for k, v in expected.items() if meta[k] != v]
    if not meta.get_all("Classifier"):
        problems.append(f"{wheel.name}: no classifiers")
    with tarfile.open(sdist) as t:
        top = t.getnames()[0].split("/")[0]
        problems += [f"{sdist.name}: no {p}" for p in ("LICENSE", "src/chunkx/py.typed")
                     if f"{top}/{p}" not in t.getnames()]
    if problems:
        sys.exit("\n".join(problems))
    print(f"{wheel.name}, {sdist.name}: py.typed, LICENSE and metadata present")


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "dist"))
