#!/usr/bin/env python3
"""The commands the documentation shows exist as shown (a mechanical check, no tided run).

Usage: test_docs_commands.py SRC_DIR BUILD_DIR

In README.md and the pages an operator types from (docs/operator.md, elastic.md,
slurm.md, multihost.md, checkpoints.md, offline.md), every `tidectl ...`, `tided ...`,
`tide-ckpt ...` and `train_mlp ...` command, in a shell block or in inline code, is
checked against the built programs' --help: the tidectl or tide-ckpt command exists, and
each --flag given is one its help lists. In docs/operator.md, which documents tided's and tidectl's settings in prose
too, every --flag of its prose must also be one that tided, tidectl (any command) or
train_mlp lists, or one of the few of mpirun's that it names. A flag renamed or
removed in the code therefore fails here until the page says what the program does.
"""
import os
import re
import subprocess
import sys

PAGES = ("README.md", "docs/operator.md", "docs/elastic.md", "docs/slurm.md",
         "docs/multihost.md", "docs/checkpoints.md", "docs/offline.md")
# tidectl's global options that take a value (they may come before the command)
GLOBAL_WITH_VALUE = {"--endpoint", "--timeout-ms", "--key", "--server-key", "--log"}
# mpirun's own options, as docs/operator.md's prose names them
MPIRUN_FLAGS = {"--enable-recovery", "--mca", "--host", "--oversubscribe"}
PROGRAMS = {"tided", "tidectl", "tide-ckpt", "train_mlp"}
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*|-o)(?![\w-])")


def helptext(*argv):
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        sys.exit("FAILED: %s exited %d: %s" % (" ".join(argv), r.returncode, r.stderr))
    return r.stdout + r.stderr


def options(text):
    """The flags a --help lists: its option lines, and the usage line's."""
    found = set()
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("-") or s.startswith("usage:"):
            found.update(FLAG.findall(s))
        if s.startswith("-o,") or " -o " in s or "(-o " in s:
            found.add("-o")
    return found


def main():
    src, build = sys.argv[1], sys.argv[2]
    tided = os.path.join(build, "coordinator", "tided")
    tidectl = os.path.join(build, "coordinator", "tidectl")
    train_mlp = os.path.join(build, "examples", "train_mlp")
    top = helptext(tidectl, "--help")
    commands = re.findall(r"^  ([a-z]+)  ", top, re.M)
    if len(commands) < 10:
        sys.exit("FAILED: tidectl --help lists %d commands: %s" % (len(commands), top))
    ctl = {c: options(helptext(tidectl, c, "--help")) for c in commands}
    ctl_global = options(top)
    srv = options(helptext(tided, "--help"))
    every = set(srv) | ctl_global | set().union(*ctl.values())
    mlp = options(helptext(train_mlp, "--help")) if os.access(train_mlp, os.X_OK) else None
    every |= mlp or set()
    ckpt_help = helptext(os.path.join(build, "ckpt", "tide-ckpt"), "--help")
    ckpt_cmds = set(re.findall(r"tide-ckpt ([a-z]+) ", ckpt_help))
    ckpt = set(FLAG.findall(ckpt_help))

    errors, checked = [], 0

    def check_segment(page, where, seg):
        nonlocal checked
        words = seg.split()
        # a program of tide's anywhere in the segment: mpirun ... train_mlp --tide ...
        at = [i for i, w in enumerate(words) if os.path.basename(w) in PROGRAMS]
        if not at:
            return
        words = words[at[0]:]
        seg = " ".join(words)
        prog = os.path.basename(words[0])
        if prog == "tided":
            for f in FLAG.findall(seg):
                checked += 1
                if f not in srv:
                    errors.append("%s:%s: tided %s: not in tided --help" % (page, where, f))
        elif prog == "train_mlp" and mlp is not None:
            for f in FLAG.findall(seg):
                checked += 1
                if f not in mlp:
                    errors.append("%s:%s: train_mlp %s: not in train_mlp --help" % (page, where, f))
        elif prog == "tide-ckpt":
            if len(words) > 1 and words[1] not in ckpt_cmds:
                errors.append("%s:%s: tide-ckpt %s: no such command (tide-ckpt --help)"
                              % (page, where, words[1]))
            for f in FLAG.findall(seg):
                checked += 1
                if f not in ckpt:
                    errors.append("%s:%s: tide-ckpt %s: not in tide-ckpt --help" % (page, where, f))
        elif prog == "tidectl":
            i, cmd = 1, None
            while i < len(words):
                w = words[i].strip("[]")
                if w in GLOBAL_WITH_VALUE:
                    i += 2
                    continue
                if w.startswith("-"):
                    i += 1
                    continue
                cmd = w
                break
            if cmd is None:
                return
            if cmd not in ctl:
                errors.append("%s:%s: tidectl %s: no such command (tidectl --help)" % (page, where, cmd))
                return
            args = seg.split(" -- ")[0]  # what follows -- is the offline command's own
            for f in FLAG.findall(args):
                checked += 1
                if f not in ctl[cmd] and f not in ctl_global:
                    errors.append("%s:%s: tidectl %s %s: not in tidectl %s --help"
                                  % (page, where, cmd, f, cmd))

    def check_line(page, where, line):
        for seg in re.split(r";|&&|\|\||\||\$\(|`", line):
            check_segment(page, where, seg.strip().lstrip("(").strip())

    for page in PAGES:
        path = os.path.join(src, page)
        with open(path) as f:
            lines = f.read().split("\n")
        fence = False
        for n, line in enumerate(lines, 1):
            if line.startswith("```"):
                fence = not fence
                continue
            if fence:
                code = line.split(" #")[0] if not line.lstrip().startswith("#") else ""
                check_line(page, n, code)
            else:
                for span in re.findall(r"`([^`]+)`", line):
                    check_line(page, n, span)
            if page == "docs/operator.md" and not fence:
                for f in FLAG.findall(line.split(" -- ")[0]):
                    checked += 1
                    if f not in every | MPIRUN_FLAGS:
                        errors.append("%s:%d: %s: no flag of tided, tidectl or train_mlp"
                                      % (page, n, f))
    if errors:
        print("\n".join("FAILED: " + e for e in errors))
        sys.exit(1)
    print("test_docs_commands: passed: %d flags in %d pages, each in its program's --help"
          % (checked, len(PAGES)))


if __name__ == "__main__":
    main()
