# Shared by the side-by-side scripts (rps-ab.sh, ttft-ab.sh); sourced after `out` is set.

# Every process started goes into `pids` and is stopped when the script exits.
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

nginx_conf() { # name http-body: one nginx process in the foreground, its files under $out
  printf 'worker_processes 1;\nmaster_process off;\ndaemon off;\npid %s;\nerror_log %s;\n' \
    "$out/$1.pid" "$out/$1-error.log"
  printf 'events { worker_connections 1024; }\nhttp { access_log off; %s }\n' "$2"
}

nginx_proxy() { # port upstream: a server block proxying to upstream, keepalive, no buffering
  printf 'upstream u%s { server %s; keepalive 64; } server { listen 127.0.0.1:%s; location / { proxy_pass http://u%s; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; } }' \
    "$1" "$2" "$1" "$1"
}

arm_binary() { # NAME=BINARY[+EXTRA.yaml]: the binary
  local spec=${1#*=}
  echo "${spec%%+*}"
}

arm_extra() { # NAME=BINARY[+EXTRA.yaml]: the YAML file appended to the arm's gateway config, if any
  local spec=${1#*=}
  [ "$spec" != "${spec%%+*}" ] && cat "${spec#*+}"
  return 0
}
