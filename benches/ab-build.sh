# Sourced by the same-run A/B benches (step-ab.sh, multiturn.sh), with $root set: makes
# $work (removed on exit, with its worktree) and builds wirl in release at commit $1 into
# $work/wirl-A and at commit $2 (or, without one, the working tree) into $work/wirl-B, the
# other commit in a worktree sharing the target directory. With AB_KEEP=DIR: the two builds
# are kept in DIR, and a later bench given the same AB_KEEP uses them without building
# (step-ab.sh and decode-ab.sh on the same pair of commits).
work=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$work/tree" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
ab_build() {
    local before=$1 after=${2:-}
    if [ -n "${AB_KEEP:-}" ] && [ -x "$AB_KEEP/wirl-A" ] && [ -x "$AB_KEEP/wirl-B" ]; then
        cp "$AB_KEEP/wirl-A" "$AB_KEEP/wirl-B" "$work/"
        return
    fi
    local target=${CARGO_TARGET_DIR:-$root/target}
    # Cargo does not tell two checkouts of the same crates apart by path alone: touching the
    # sources makes each build compile its own.
    build() {
        find "$1/host" -name '*.rs' -exec touch {} +
        (cd "$1" && CARGO_TARGET_DIR=$target cargo build -q --release -p wirl-cli)
        cp "$target/release/wirl" "$2"
    }
    git -C "$root" worktree add --detach "$work/tree" "$before" >/dev/null
    build "$work/tree" "$work/wirl-A"
    if [ -n "$after" ]; then
        git -C "$work/tree" checkout -q --detach "$after"
        build "$work/tree" "$work/wirl-B"
    else
        build "$root" "$work/wirl-B"
    fi
    if [ -n "${AB_KEEP:-}" ]; then
        mkdir -p "$AB_KEEP" && cp "$work/wirl-A" "$work/wirl-B" "$AB_KEEP/"
    fi
}
# Prints each side's median over the runs in $1 (lines "A value" / "B value") in unit $2,
# then B/A.
ab_medians() {
    python3 - "$1" "$2" <<'PY'
import statistics, sys
sides = {}
for line in open(sys.argv[1]):
    parts = line.split()
    if len(parts) == 2 and parts[0] in "AB":
        sides.setdefault(parts[0], []).append(float(parts[1]))
med = {side: statistics.median(values) for side, values in sides.items()}
for side, value in med.items():
    print(f"{side}: median {value:.2f} {sys.argv[2]} over {len(sides[side])} runs")
print(f"B/A: {med['B'] / med['A']:.3f}")
PY
}
