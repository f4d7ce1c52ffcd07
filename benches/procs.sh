# Sourced by the bench scripts that start servers: every process started goes into `pids`, and
# `stop` kills and reaps them (between arms, and when the script exits).
pids=()
stop() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done; pids=(); }
trap stop EXIT
