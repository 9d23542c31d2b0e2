#!/usr/bin/env bash
# End-to-end checkpoints through the real programs (train_mlp under mpirun, tide-ckpt,
# tided, tidectl). PART resume:
#  1. a run in (2, 2, 2) saves every 4 steps (asynchronously) up to step 8;
#  2. a resumed run whose save crashes mid-way (TIDE_CKPT_FAULT=shards:1: every writer
#     _exits after its first shard) leaves step 8 the newest complete checkpoint;
#  3. tide-ckpt verify passes; tide-ckpt convert into (1, 2, 4; uneven stages) gives
#     shard files byte-identical to those a job resumed in that layout saves again, and
#     runs resumed from either continue with identical losses;
#  4. a bit-flipped shard of step 8 is refused naming the file and the run resumes from
#     step 4; tide-ckpt verify names the file and fails;
#  5. elastic mode (libtide's tide_checkpoint_every under tided): a --tide run in
#     (2, 2, 2) checkpoints every 3 steps asynchronously; a --tide job resumes from it in
#     (1, 4, 2) and a standalone one in (4, 1, 2).
# PART links (a shared root someone else can write into; nothing may follow a link):
#  1. before a --tide run in (1, 2, 1) saving every 2 steps keeping 2, the root holds a
#     link step-1 to a foreign directory (pruning must not empty it), a link step-4 to an
#     empty directory (the save of step 4 must fail, reported naming the link, and write
#     nothing there) and a real step-6 holding a link named like a shard to a foreign
#     file (the save must replace the link, never write the file); steps 2 and 6 are
#     published and verify;
#  2. a link step-99 to a copy of a checkpoint is not followed by --resume (which resumes
#     at step 6), and tide-ckpt refuses it naming the link;
#  3. a checkpoint directory restored under another step's name (step-16 holding step 6)
#     resumes at the step of its manifest, standalone and under tided, and tide-ckpt info
#     says step 6;
#  4. a FIFO where the manifest or a shard is expected: tide-ckpt verify and --resume fail
#     within seconds with a message naming it, instead of blocking.
# PART full (a checkpoint disk that fills; needs root for mount namespaces and tmpfs):
#     a --tide job, dp 2 with ZeRO-1 (so losing a rank rolls back to a checkpoint), paced
#     to 25 ms a step, saves every 10 steps; rank 1 runs in its own mount namespace. Once
#     checkpoints are published, a 2 MiB tmpfs filled to the last byte is mounted over the
#     root in rank 1's namespace, in 3 s windows interleaved with 3 s of a working disk:
#     rank 1's shards fail with ENOSPC (a checkpoint_failed event naming rank 1 and the
#     errno), the publisher gives up on them within TIDE_CKPT_TIMEOUT_MS (2 s), and the
#     step rate (wall-clock step starts from the trace, printed) with the full disk keeps
#     at least half the rate with a working one (a loop that waited on the disk: 0).
#     Then rank 1 is killed while its disk is full: tided rolls the job back
#     to the last complete checkpoint over rank 0, which trains on and saves again.
# Usage: test_ckpt_resume.sh PART TRAIN_MLP TIDE_CKPT TIDED TIDECTL MPIEXEC [FLAGS...]
set -euo pipefail
PART=$1 TRAIN=$2 TOOL=$3 TIDED=$4 TIDECTL=$5
shift 5
MPI=("$@")
# shellcheck source=tided_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/tided_lib.sh"
tl_setup tide-ckpt-e2e
COMMON=(--layers 6 --print-every 100)

start_tided() { tl_tided "$TIDED" "$TIDECTL" --heartbeat-ms 100 "$@"; }

events() { ctl events --limit 10000 --json; }

# Each checkpoint_failed event of job $1 (one per line). Whole outputs are captured before
# a grep -q reads them: a writer cut off by grep's early exit would fail the pipeline.
failed_events() {
  local ev
  ev=$(events)
  grep -o '{[^{}]*"kind":"checkpoint_failed"[^{}]*}' <<<"$ev" | grep "\"job\":\"$1\"" || true
}

# Whether tided has an event of kind $1.
has_event() {
  local ev
  ev=$(events)
  grep -q "\"kind\":\"$1\"" <<<"$ev"
}

part_resume() {
  "${MPI[@]}" -np 8 "$TRAIN" "${COMMON[@]}" --dp 2 --tp 2 --pp 2 --steps 8 --ckpt-every 4 \
    --ckpt-save "$WORK/R" > "$WORK/a.log" 2>&1 || { cat "$WORK/a.log"; fail "first run"; }
  [ -f "$WORK/R/step-000000000004/MANIFEST" ] && [ -f "$WORK/R/step-000000000008/MANIFEST" ] ||
    fail "checkpoints 4 and 8 not published: $(ls -R "$WORK/R")"

  # 2. a crash in the middle of a save
  if TIDE_CKPT_FAULT=shards:1 "${MPI[@]}" -x TIDE_CKPT_FAULT -np 8 "$TRAIN" "${COMMON[@]}" \
    --dp 2 --tp 2 --pp 2 --steps 12 --ckpt-every 2 --no-ckpt-async --resume "$WORK/R" \
    --ckpt-save "$WORK/R" > "$WORK/crash.log" 2>&1; then
    cat "$WORK/crash.log"; fail "the run with an injected crash succeeded"
  fi
  grep -q "TIDE_CKPT_FAULT=shards:1: exiting" "$WORK/crash.log" || { cat "$WORK/crash.log"; fail "no crash"; }
  [ -d "$WORK/R/step-000000000010" ] || fail "the crashed save left no trace (was it reached?)"
  [ ! -f "$WORK/R/step-000000000010/MANIFEST" ] || fail "the crashed save was published"
  "$TOOL" info "$WORK/R" > "$WORK/info.log" || fail "tide-ckpt info"
  grep -q "step 8$" "$WORK/info.log" || { cat "$WORK/info.log"; fail "newest is not step 8"; }

  # 3. verify, convert, and the same layout loaded by a job
  "$TOOL" verify "$WORK/R" || fail "verify"
  "$TOOL" convert "$WORK/R" "$WORK/C" --dp 1 --tp 2 --pp 4 --stages 0-0,1-2,3-3,4-5 || fail "convert"
  "$TOOL" verify "$WORK/C" || fail "verify of the converted checkpoint"
  NEW=(--dp 1 --tp 2 --pp 4 --stages 0-0,1-2,3-3,4-5)
  "${MPI[@]}" -np 8 "$TRAIN" "${COMMON[@]}" "${NEW[@]}" --steps 8 --resume "$WORK/R" \
    --ckpt-save "$WORK/L" > "$WORK/l.log" 2>&1 || { cat "$WORK/l.log"; fail "resave in the new layout"; }
  n=0
  for f in "$WORK/C/step-000000000008"/shard-*.bin; do
    cmp "$f" "$WORK/L/step-000000000008/$(basename "$f")" || fail "$(basename "$f") differs"
    n=$((n + 1))
  done
  [ "$n" -eq 8 ] || fail "expected 8 shard files in (1, 2, 4), found $n"
  for src in R C; do
    "${MPI[@]}" -np 8 "$TRAIN" "${COMMON[@]}" "${NEW[@]}" --steps 12 --resume "$WORK/$src" \
      --loss-out "$WORK/loss-$src.txt" > "$WORK/r-$src.log" 2>&1 || { cat "$WORK/r-$src.log"; fail "resume $src"; }
    grep -q "resumed at step 8" "$WORK/r-$src.log" || fail "resume $src did not start at step 8"
  done
  cmp "$WORK/loss-R.txt" "$WORK/loss-C.txt" || fail "losses after convert differ from a direct load"
  [ "$(wc -l < "$WORK/loss-R.txt")" -eq 4 ] || fail "expected 4 resumed steps"

  # 4. a corrupted shard: refused naming the file; the run falls back to step 4
  shard="$WORK/R/step-000000000008/shard-p1-d0-t1.bin"
  printf '\x5a' | dd of="$shard" bs=1 seek=4096 conv=notrunc status=none
  if "$TOOL" verify "$WORK/R" > "$WORK/v.log" 2>&1; then fail "verify passed a flipped byte"; fi
  grep -q "shard-p1-d0-t1.bin is corrupted" "$WORK/v.log" || { cat "$WORK/v.log"; fail "verify message"; }
  "${MPI[@]}" -np 8 "$TRAIN" "${COMMON[@]}" --dp 4 --tp 1 --pp 2 --steps 6 --resume "$WORK/R" \
    > "$WORK/fb.log" 2>&1 || { cat "$WORK/fb.log"; fail "fallback run"; }
  grep -q "shard-p1-d0-t1.bin is corrupted" "$WORK/fb.log" || { cat "$WORK/fb.log"; fail "no refusal"; }
  grep -q "resumed at step 4" "$WORK/fb.log" || { cat "$WORK/fb.log"; fail "no fallback to step 4"; }

  # 5. elastic mode
  start_tided --miss-limit 50
  "${MPI[@]}" -np 8 "$TRAIN" "${COMMON[@]}" --tide --endpoint "$EP" --job ck1 --dp 2 --tp 2 --pp 2 \
    --steps 7 --ckpt-every 3 --ckpt-save "$WORK/T" > "$WORK/t.log" 2>&1 || { cat "$WORK/t.log"; fail "--tide run"; }
  for s in 3 6 7; do
    [ -f "$WORK/T/step-00000000000$s/MANIFEST" ] || { ls -R "$WORK/T"; fail "--tide: step $s not published"; }
  done
  "$TOOL" verify "$WORK/T/step-000000000006" || fail "verify of libtide's checkpoint"
  "${MPI[@]}" -np 8 "$TRAIN" "${COMMON[@]}" --tide --endpoint "$EP" --job ck2 --dp 1 --tp 4 --pp 2 \
    --steps 10 --resume "$WORK/T" > "$WORK/t2.log" 2>&1 || { cat "$WORK/t2.log"; fail "--tide resume"; }
  grep -q "resumed at step 7" "$WORK/t2.log" || { cat "$WORK/t2.log"; fail "--tide resume step"; }
  grep -q "10 steps done" "$WORK/t2.log" || { cat "$WORK/t2.log"; fail "--tide resumed run did not finish"; }
  "${MPI[@]}" -np 8 "$TRAIN" "${COMMON[@]}" --dp 4 --tp 1 --pp 2 --steps 9 \
    --resume "$WORK/T/step-000000000006" > "$WORK/t3.log" 2>&1 || { cat "$WORK/t3.log"; fail "standalone resume"; }
  grep -q "resumed at step 6" "$WORK/t3.log" || { cat "$WORK/t3.log"; fail "standalone resume step"; }
}

# A step directory's name under root $1 for step $2.
sdir() { printf '%s/step-%012d' "$1" "$2"; }

part_links() {
  local R=$WORK/R V=$WORK/victim
  mkdir -p "$R" "$V/dir" "$WORK/elsewhere"
  printf 'theirs' > "$V/dir/MANIFEST"
  printf 'theirs' > "$V/dir/shard-p0-d0-t0.bin"
  printf 'precious' > "$V/file"
  ln -s "$V/dir" "$(sdir "$R" 1)"
  ln -s "$WORK/elsewhere" "$(sdir "$R" 4)"
  mkdir "$(sdir "$R" 6)"
  ln -s "$V/file" "$(sdir "$R" 6)/shard-p0-d0-t1.bin"
  start_tided --miss-limit 50
  local L=(--dp 1 --tp 2 --pp 1)
  "${MPI[@]}" -np 2 "$TRAIN" "${COMMON[@]}" "${L[@]}" --tide --endpoint "$EP" --job links \
    --steps 6 --ckpt-every 2 --ckpt-keep 2 --ckpt-save "$R" > "$WORK/links.log" 2>&1 ||
    { cat "$WORK/links.log"; fail "the run in a root with planted links"; }
  [ "$(cat "$V/dir/MANIFEST")$(cat "$V/dir/shard-p0-d0-t0.bin")" = theirstheirs ] ||
    fail "pruning emptied the directory a link named like a step points to: $(ls -la "$V/dir")"
  [ "$(cat "$V/file")" = precious ] || fail "a save wrote through a link named like a shard"
  [ -z "$(ls -A "$WORK/elsewhere")" ] || fail "the save of step 4 went through a linked step directory"
  [ -L "$(sdir "$R" 1)" ] && [ -L "$(sdir "$R" 4)" ] || fail "planted links were removed"
  [ -f "$(sdir "$R" 6)/shard-p0-d0-t1.bin" ] && [ ! -L "$(sdir "$R" 6)/shard-p0-d0-t1.bin" ] ||
    fail "step 6's shard is not a regular file"
  for s in 2 6; do
    "$TOOL" verify "$(sdir "$R" "$s")" > /dev/null || fail "verify of step $s"
  done
  local ev
  ev=$(failed_events links)
  grep -q "step-000000000004 is a symbolic link" <<<"$ev" ||
    { echo "$ev"; fail "no checkpoint_failed event naming the linked step directory"; }
  grep -q "rank [01]: " <<<"$ev" || { echo "$ev"; fail "the failed save does not name its rank"; }

  # 2. a link named like a newer step: neither --resume nor tide-ckpt follows it
  cp -a "$(sdir "$R" 6)" "$WORK/copy"
  ln -s "$WORK/copy" "$(sdir "$R" 99)"
  "${MPI[@]}" -np 2 "$TRAIN" "${COMMON[@]}" "${L[@]}" --steps 8 --resume "$R" \
    > "$WORK/r-link.log" 2>&1 || { cat "$WORK/r-link.log"; fail "resume next to a linked step"; }
  grep -q "resumed at step 6 from $(sdir "$R" 6)" "$WORK/r-link.log" ||
    { cat "$WORK/r-link.log"; fail "--resume followed a link named like step 99"; }
  if "$TOOL" info "$(sdir "$R" 99)" > "$WORK/i-link.log" 2>&1; then fail "tide-ckpt followed a link"; fi
  grep -q "is a symbolic link" "$WORK/i-link.log" || { cat "$WORK/i-link.log"; fail "tide-ckpt's message"; }

  # 3. a directory restored under another step's name resumes at its manifest's step
  local N=$WORK/renamed
  mkdir "$N"
  cp -a "$(sdir "$R" 6)" "$(sdir "$N" 16)"
  "$TOOL" info "$N" > "$WORK/i-ren.log" || fail "tide-ckpt info of a renamed checkpoint"
  grep -q "step 6$" "$WORK/i-ren.log" || { cat "$WORK/i-ren.log"; fail "tide-ckpt info: not step 6"; }
  "${MPI[@]}" -np 2 "$TRAIN" "${COMMON[@]}" "${L[@]}" --steps 10 --resume "$N" \
    --loss-out "$WORK/renamed.loss" > "$WORK/r-ren.log" 2>&1 || { cat "$WORK/r-ren.log"; fail "resume renamed"; }
  grep -q "resumed at step 6 from" "$WORK/r-ren.log" || { cat "$WORK/r-ren.log"; fail "standalone resume step"; }
  [ "$(wc -l < "$WORK/renamed.loss")" -eq 4 ] || fail "expected steps 6..9 after a renamed checkpoint"
  "${MPI[@]}" -np 2 "$TRAIN" "${COMMON[@]}" "${L[@]}" --tide --endpoint "$EP" --job renamed \
    --steps 10 --resume "$N" --loss-out "$WORK/renamed-t.loss" > "$WORK/r-ren-t.log" 2>&1 ||
    { cat "$WORK/r-ren-t.log"; fail "--tide resume renamed"; }
  grep -q "resumed at step 6 from" "$WORK/r-ren-t.log" || { cat "$WORK/r-ren-t.log"; fail "--tide resume step"; }
  cmp "$WORK/renamed.loss" "$WORK/renamed-t.loss" || fail "--tide resumed a renamed checkpoint elsewhere"

  # 4. FIFOs where a manifest and a shard are expected: refused at once, never read
  local F=$WORK/fifo S=$WORK/fifo-shard rc=0
  mkdir "$F" "$S"
  cp -a "$(sdir "$R" 6)" "$(sdir "$F" 6)"
  rm "$(sdir "$F" 6)/MANIFEST"
  mkfifo "$(sdir "$F" 6)/MANIFEST"
  cp -a "$(sdir "$R" 6)" "$(sdir "$S" 6)"
  rm "$(sdir "$S" 6)/shard-p0-d0-t1.bin"
  mkfifo "$(sdir "$S" 6)/shard-p0-d0-t1.bin"
  timeout -k 5 30 "$TOOL" verify "$(sdir "$F" 6)" > "$WORK/v-fifo.log" 2>&1 || rc=$?
  [ "$rc" -eq 1 ] || { cat "$WORK/v-fifo.log"; fail "tide-ckpt verify of a FIFO manifest: exit $rc"; }
  grep -q "MANIFEST is a FIFO, not a regular file" "$WORK/v-fifo.log" || { cat "$WORK/v-fifo.log"; fail "message"; }
  rc=0
  timeout -k 5 30 "$TOOL" verify "$S" > "$WORK/v-fifo2.log" 2>&1 || rc=$?
  [ "$rc" -eq 1 ] || { cat "$WORK/v-fifo2.log"; fail "tide-ckpt verify of a FIFO shard: exit $rc"; }
  grep -q "shard-p0-d0-t1.bin is a FIFO" "$WORK/v-fifo2.log" || { cat "$WORK/v-fifo2.log"; fail "message"; }
  for root in "$F" "$S"; do
    rc=0
    timeout -k 5 60 "${MPI[@]}" -np 2 "$TRAIN" "${COMMON[@]}" "${L[@]}" --steps 8 \
      --resume "$root" > "$WORK/r-fifo.log" 2>&1 || rc=$?
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] ||
      { cat "$WORK/r-fifo.log"; fail "--resume $root: exit $rc (0: resumed; 124: blocked)"; }
    grep -q "is a FIFO, not a regular file" "$WORK/r-fifo.log" || { cat "$WORK/r-fifo.log"; fail "--resume message"; }
  done
}

# The pid of rank $2 among the children of mpirun $1.
rank_pid() {
  local c
  for c in $(pgrep -P "$1"); do
    grep -qx "OMPI_COMM_WORLD_RANK=$2" <<<"$(tr '\0' '\n' < "/proc/$c/environ" 2>/dev/null)" &&
      { echo "$c"; return 0; }
  done
  return 1
}

# "RATE STEPS": steps per second of the trace's steps of generation 1 over the windows
# [a, b] (us) given as "a:b a:b ...", and how many step intervals that counts.
rate() {
  awk -v w="$2" 'BEGIN { n = split(w, ws, " "); for (i = 1; i <= n; i++) { split(ws[i], ab, ":");
      a[i] = ab[1]; b[i] = ab[2] } }
    $1 == "step" && $4 == 1 { for (i = 1; i <= n; i++) if ($6 >= a[i] && $6 <= b[i]) {
      if (!(i in f)) f[i] = $6; l[i] = $6; c[i]++ } }
    END { for (i = 1; i <= n; i++) if (c[i] > 1) { steps += c[i] - 1; us += l[i] - f[i] }
      printf "%.2f %d\n", (us > 0 ? steps / (us / 1e6) : 0), steps }' "$1"
}

gen_steps() { awk -v g="$2" '$1 == "step" && $4 == g { n++ } END { print n + 0 }' "$1"; }

# The id of the last event of kind $1 (0: none).
event_id() {
  local ev
  ev=$(events)
  grep -o "{\"id\":[0-9]*,[^{}]*\"kind\":\"$1\"" <<<"$ev" | tail -1 | grep -o '^{"id":[0-9]*' |
    grep -o '[0-9]*$' || echo 0
}

last_step() { awk '$1 == "step" { s = $2 } END { print s + 0 }' "$1" 2>/dev/null || echo 0; }
now_us() { date +%s%6N; }

part_full() {
  [ "$(id -u)" -eq 0 ] || { echo "SKIP: needs root (mount namespace, tmpfs)"; exit 77; }
  local R=$WORK/R T=$WORK/trace
  mkdir -p "$R"
  cat > "$WORK/wrap" <<'WRAP'
#!/usr/bin/env bash
# rank 1 in a mount namespace of its own: the test mounts a full disk over the root there
if [ "${OMPI_COMM_WORLD_RANK:-}" = 1 ]; then exec unshare -m --propagation private "$@"; fi
exec "$@"
WRAP
  chmod +x "$WORK/wrap"
  start_tided --miss-limit 15
  TIDE_CKPT_TIMEOUT_MS=2000 "${MPI[@]}" -x TIDE_CKPT_TIMEOUT_MS --enable-recovery \
    --mca async_mpi_finalize 1 -np 2 "$WORK/wrap" "$TRAIN" --layers 4 --hidden 32 --ffn 64 \
    --vocab 32 --seq 8 --global-batch 16 --micro-batches 2 --print-every 100 \
    --dp 2 --zero1 --tide --endpoint "$EP" --job full --steps 100000 --pace-ms 25 \
    --ckpt-every 10 --ckpt-keep 2 --ckpt-save "$R" --trace-out "$T" > "$WORK/full.log" 2>&1 &
  JOB_PID=$!
  tl_track $JOB_PID
  local p1="" ev ok_n full_n
  for _ in $(seq 300); do
    p1=$(rank_pid "$JOB_PID" 1) && [ "$(last_step "$T")" -ge 60 ] && break
    sleep 0.1
  done
  [ -n "$p1" ] && [ "$(last_step "$T")" -ge 60 ] || { cat "$WORK/full.log"; fail "the job did not start"; }
  for _ in $(seq 300); do
    has_event checkpoint_saved && break
    sleep 0.1
  done
  has_event checkpoint_saved || fail "no checkpoint saved before the disk fills"
  # Windows of a working and of a full disk (a 2 MiB tmpfs over the root as rank 1 sees it,
  # full to the last byte), interleaved so that the machine's load weighs on both alike,
  # until each holds 100 steps (or 5 rounds); the disk stays full after the last
  local ok_w="" full_w="" round a b ok full
  for round in 1 2 3 4 5; do
    a=$(now_us)
    sleep 3
    b=$(now_us)
    ok_w="$ok_w $a:$b"
    nsenter -t "$p1" -m sh -c "mount -t tmpfs -o size=2m tide-full '$R' &&
      { dd if=/dev/zero of='$R/fill' bs=64k > /dev/null 2>&1; true; }" || fail "cannot mount a tmpfs"
    sleep 0.5
    a=$(now_us)
    sleep 3
    b=$(now_us)
    full_w="$full_w $a:$b"
    read -r ok ok_n <<<"$(rate "$T" "$ok_w")"
    read -r full full_n <<<"$(rate "$T" "$full_w")"
    [ "$round" -ge 2 ] && [ "$ok_n" -ge 100 ] && [ "$full_n" -ge 100 ] && break
    [ "$round" -eq 5 ] || nsenter -t "$p1" -m umount -l "$R" || fail "cannot unmount the tmpfs"
  done
  for _ in $(seq 100); do
    grep -q "was not written within 2000 ms" <<<"$(failed_events full)" && break
    sleep 0.1
  done
  ev=$(failed_events full)
  grep -q "rank 1: .*No space left on device (ENOSPC)" <<<"$ev" ||
    { echo "$ev"; fail "no checkpoint_failed event naming rank 1 and ENOSPC"; }
  grep -q "was not written within 2000 ms" <<<"$ev" ||
    { echo "$ev"; fail "the publisher did not give up on the missing shard within its bound"; }
  echo "step rate: $ok steps/s with a working checkpoint disk, $full steps/s with a full one" \
    "($ok_n and $full_n steps in $round rounds of 3 s each; 40 steps/s paced)"
  # Rates are the benchmark's business (docs/failure-model.md carries the figures);
  # the test asks what a user relies on: the loop does not wait for a disk that cannot
  # take its shards. A save that blocked the loop shows as a rate near 0 (old main: 0),
  # a busy machine as a few tens of percent either way, so half the working rate passes.
  awk -v a="$ok" -v b="$full" 'BEGIN { exit !(a > 0 && b >= 0.5 * a) }' ||
    fail "the step rate fell from $ok to $full steps/s while the disk was full"
  # a rank dies while saves fail: the job rolls back to its last complete checkpoint, trains
  # on and saves again (its disk works)
  local p0 rb=0 saved=0
  p0=$(rank_pid "$JOB_PID" 0) || fail "no rank 0"
  kill -KILL "$p1"
  for _ in $(seq 300); do
    rb=$(event_id rolled_back)
    [ "$rb" -gt 0 ] && break
    sleep 0.1
  done
  [ "$rb" -gt 0 ] || { events; cat "$WORK/full.log"; fail "no rollback after the kill"; }
  for _ in $(seq 600); do
    saved=$(event_id checkpoint_saved)
    [ "$saved" -gt "$rb" ] && [ "$(gen_steps "$T" 2)" -ge 50 ] && break
    sleep 0.1
  done
  [ "$(gen_steps "$T" 2)" -ge 50 ] || { cat "$WORK/full.log"; fail "the job did not train on after the rollback"; }
  [ "$saved" -gt "$rb" ] || { events; fail "no checkpoint saved after the rollback"; }
  grep -q "generation 2 from step" "$WORK/full.log" || { cat "$WORK/full.log"; fail "no switch to generation 2"; }
  # the job would train 100000 steps: it ends with its last rank
  kill -KILL "$p0"
  timeout -k 5 60 tail --pid="$JOB_PID" -f /dev/null || fail "mpirun did not end with its ranks"
  tl_wait "$JOB_PID" || true
}

case "$PART" in
resume) part_resume ;;
links) part_links ;;
full) part_full ;;
*) fail "unknown part $PART" ;;
esac
# what the programs said under a sanitizer build stays in their logs: bring it out
if grep -l "ERROR: AddressSanitizer\|ERROR: LeakSanitizer\|runtime error:" "$WORK"/*.log 2>/dev/null; then
  grep -h -A30 "ERROR: AddressSanitizer\|ERROR: LeakSanitizer\|runtime error:" "$WORK"/*.log | head -120
  fail "a sanitizer report in the logs above"
fi
echo "PASS test_ckpt_resume $PART"
