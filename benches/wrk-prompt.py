#!/usr/bin/env python3
"""Writes a wrk script (to stdout) that sends benches/wrk-chat.lua's request with a 32 KB user
message of prose or of source code: the prompts of benches/peek.rs, for
`WRK_SCRIPT=... benches/instructions.sh` (docs/benchmarks/overhead.md, "Request size").

Usage: python3 benches/wrk-prompt.py prose|code > /tmp/prompt.lua
"""
import json
import pathlib
import sys

LINES = {
    "prose": "The quick brown fox jumps over the lazy dog, again and again, and once more for good "
    "measure. Then it rests in the shade of an old oak tree, watching the river run by, until the "
    "sun goes down behind the hills and the evening comes.\n\n",
    "code": '    if key == "model" {\n        return Some("value");\n    }\n',
}

kind = sys.argv[1] if len(sys.argv) > 1 else ""
if kind not in LINES:
    sys.exit("usage: wrk-prompt.py prose|code")
line = LINES[kind]
body = json.dumps(
    {
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": line * (32000 // len(line) + 1)},
        ],
        "model": "s",
        "max_tokens": 1,
    },
    separators=(",", ":"),
)
chat = (pathlib.Path(__file__).parent / "wrk-chat.lua").read_text()
print('wrk.method = "POST"\nwrk.body = [==[' + body + "]==]\n" + chat[chat.index("wrk.headers"):], end="")
