"""File operations of the container backend, run inside the container with `exec` and `sh`.

Every read, write and search is one `<engine> exec` of a POSIX sh script (busybox and Debian
images alike; no interpreter needed in the image), so paths, `..` and symlinks are resolved by
the container's kernel view as the image's user: a link can only reach what the sample itself
can, never a host file behind the bind-mounted workspace. The script checks the real path is
under the workspace mount, refuses directories, links and non-regular files, and opens a file
read-write first (a FIFO opened O_RDWR never blocks) to check the opened descriptor through
/proc/self/fd (writes then reopen that descriptor's inode to truncate it); the remaining
window (a read-only file swapped for a FIFO between two opens) is bounded by the exec
timeout, never a hang. Search streams the
regular files below a directory as a tar (find lists regular files without following links,
tar never opens a FIFO) and matches them on the runner with fsops.scan.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import posixpath
import tarfile

from trajforge.sandbox.interface import FileOpError, PathEscapeError, SandboxError, SymlinkError
from trajforge.sandbox.inside.fsops import SKIP_DIRS, check_model_path
from trajforge.sandbox.search_child import search_in_child
from trajforge.sandbox.process import kill_group

FILE_OP_TIMEOUT = 30.0
MAX_TAR = 64 << 20
# Reports problems as "E <kind>" on stderr with exit 3; $1 absolute path (normalized, under the
# mount: the runner checks that lexically first), $2 workspace mount, $3 cwd.
_PRELUDE = r'''
E() { echo "E $1" >&2; exit 3; }
cd -- "$3" 2>/dev/null || cd -- "$2" || E other
p=$1
[ -e "$p" ] || [ -h "$p" ] || NOTFOUND=1
'''
_INSIDE = r'''
inside() { case "$1/" in "$2"/*) return 0;; esac; return 1; }
'''
READ = _PRELUDE + _INSIDE + r'''
[ -n "$NOTFOUND" ] && E not_found
r=$(realpath "$p" 2>/dev/null) || E not_found
inside "$r" "$2" || E escape
[ -h "$r" ] && E symlink
[ -d "$r" ] && E is_dir
[ -f "$r" ] || E not_regular
{ exec 4<>"$r"; } 2>/dev/null || exec 4<"$r" || E other
[ -f /proc/self/fd/4 ] || E not_regular
[ "$5" -gt 0 ] 2>/dev/null || exec head -c "$4" <&4
# a piece (tools/read_lines.py asks for aligned ones): dd seeks; head alone reads up to it
if [ $(($5 % 65536)) = 0 ] && [ $(($4 % 65536)) = 0 ] && command -v dd >/dev/null; then
  exec dd bs=65536 skip=$(($5 / 65536)) count=$(($4 / 65536)) <&4 2>/dev/null
fi
{ head -c "$5" >/dev/null; exec head -c "$4"; } <&4
'''
WRITE = _PRELUDE + _INSIDE + r'''
# Read the data before failing: `podman exec -i` drops the output of a process that exits with
# its stdin unread.
E() { cat > /dev/null 2>&1; echo "E $1" >&2; exit 3; }
d=$(dirname "$p"); n=$(basename "$p")
mkdir -p "$d" 2>/dev/null
rd=$(realpath "$d" 2>/dev/null) || E not_found
inside "$rd" "$2" || E escape
t="$rd/$n"
if [ "$4" = new ]; then
  stem=${n%.*}; ext=${n#"$stem"}; i=1; c=$n; set -C
  while ! { cat > "$rd/$c"; } 2>/dev/null; do
    [ -e "$rd/$c" ] || [ -h "$rd/$c" ] || E other
    i=$((i+1)); [ $i -gt 1000 ] && E exists; c="$stem-$i$ext"
  done
  echo "${rd#"$2"}/$c"; exit 0
fi
if [ -h "$t" ]; then t=$(realpath "$t" 2>/dev/null) || E symlink; inside "$t" "$2" || E escape; fi
if [ -e "$t" ]; then [ -d "$t" ] && E is_dir; [ -f "$t" ] || E not_regular
elif [ "$4" = replace ]; then E not_found; fi
{ exec 4<>"$t"; } 2>/dev/null || E other
[ -f /proc/self/fd/4 ] || E not_regular
cat > /proc/self/fd/4 || E other
echo "${t#"$2"}"
'''
SEARCH = _PRELUDE + _INSIDE + r'''
[ -n "$NOTFOUND" ] && E not_found
r=$(realpath "$p" 2>/dev/null) || E not_found
inside "$r" "$2" || E escape
[ -h "$r" ] && E symlink
if [ -f "$r" ]; then cd "$(dirname "$r")" && exec tar -c -f - "$(basename "$r")"; fi
cd "$r" || E not_found
find . \( $6 \) -prune -o -type f -size -"$4"c -print0 | xargs -0 tar -c -f -
'''


class ContainerFiles:
    def __init__(self, argv_prefix: list[str], env: dict[str, str], *, mount: str, cwd: str) -> None:
        self.prefix, self.env, self.mount, self.cwd = argv_prefix, env, mount, cwd

    def _escape(self, path: str) -> PathEscapeError:
        return PathEscapeError(f"{path!r} is outside the workspace {self.mount}; use a path relative to "
                               f"the working directory {self.cwd} or an absolute path under {self.mount}")

    def absolute(self, path: str) -> str:
        """The lexically normalized in-container path; PathEscapeError when it leaves the mount."""
        path = check_model_path(path)
        if path == "~" or path.startswith("~/"):  # HOME is the workspace
            path = self.mount + path[1:]
        full = posixpath.normpath(posixpath.join(self.cwd, path))
        if not (full == self.mount or full.startswith(self.mount.rstrip("/") + "/")):
            raise self._escape(path)
        return full

    async def _run(self, script: str, path: str, *extra: str, stdin: bytes | None = None,
                   cap: int) -> bytes:
        argv = [*self.prefix, "sh", "-c", script, "sh", self.absolute(path), self.mount, self.cwd, *extra]
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=self.env, cwd="/",
            start_new_session=True)
        try:
            async with asyncio.timeout(FILE_OP_TIMEOUT):
                out, err = await proc.communicate(stdin)
        except BaseException:
            kill_group(proc)  # the exec client; the script inside dies with its stdin/stdout
            with contextlib.suppress(ProcessLookupError):
                await asyncio.shield(proc.wait())
            raise FileOpError("other", f"the file operation did not finish within {FILE_OP_TIMEOUT:g}s") from None
        text = err.decode(errors="replace")
        for line in text.splitlines():
            if line.startswith("E "):
                kind = line[2:].strip()
                if kind == "escape":
                    raise self._escape(path)
                if kind == "symlink":
                    raise SymlinkError(path, path)
                raise FileOpError(kind, kind.replace("_", " "))
        if proc.returncode != 0:
            if proc.returncode == 125 or text.lstrip().startswith("Error"):
                raise SandboxError(f"container exec failed: {text.strip()[-300:]}")
            raise FileOpError("other", text.strip()[-300:] or f"exit status {proc.returncode}")
        if len(out) > cap:
            raise FileOpError("too_large", f"more than {cap} bytes")
        return out

    async def read(self, path: str, max_bytes: int, offset: int | None = None) -> bytes:
        if offset is not None:
            return await self._run(READ, path, str(max_bytes), str(offset), cap=max_bytes)
        data = await self._run(READ, path, str(max_bytes + 1), "0", cap=max_bytes + 1)
        if len(data) > max_bytes:
            raise FileOpError("too_large", f"more than {max_bytes} bytes")
        return data

    async def write(self, path: str, data: bytes, how: str) -> str:
        out = await self._run(WRITE, path, how, stdin=data, cap=1 << 16)
        return out.decode(errors="replace").strip().lstrip("/") or path

    async def search(self, path: str, pattern: str, *, target: str, glob: str | None, limit: int,
                     max_file: int, max_files: int) -> tuple[list[str], bool]:
        prune = " -o ".join(f"-name {d}" for d in sorted(SKIP_DIRS))  # plain names: no quoting needed
        raw = await self._run(SEARCH, path, str(max_file + 1), str(max_files), prune, cap=MAX_TAR)
        entries = []
        # xargs may run tar more than once: concatenated archives, hence ignore_zeros.
        with contextlib.suppress(tarfile.TarError), tarfile.open(fileobj=io.BytesIO(raw), mode="r:",
                                                                 ignore_zeros=True) as tar:
            members = sorted((m for m in tar.getmembers() if m.isreg()), key=lambda m: m.name)
            for m in members:
                sub = m.name[2:] if m.name.startswith("./") else m.name
                if any(part in SKIP_DIRS for part in sub.split("/")[:-1]):
                    continue
                data = (tar.extractfile(m) or io.BytesIO()).read()
                is_file_itself = "/" not in sub and len(members) == 1 and not m.name.startswith("./")
                entries.append(("" if is_file_itself else sub, sub.rsplit("/", 1)[-1], data))
        return await search_in_child({"entries": entries, "shown": path, "pattern": pattern, "target": target,
                                      "glob": glob, "limit": limit, "max_files": max_files})
