#!/usr/bin/python3
"""Render a chat template the way Hugging Face transformers' apply_chat_template does: the reference the C++ engine
(mc/text/jinja.hpp) is checked against byte for byte in tests/text/chat_template_test.cpp.

Usage: render_template.py TEMPLATE_FILE < request.json > rendered.txt
request.json: {"messages": [...], "tools": [...] or null, "add_generation_prompt": bool,
               "bos_token": str, "eos_token": str, "extra": {...}}

The environment is the one transformers builds for chat templates (as its documentation and chat_template_utils
describe it): jinja2's ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks on, the loopcontrols
extension (break/continue), the `generation` tag of its AssistantTracker (rendered as its body), a `tojson` filter that is json.dumps with ensure_ascii=False and sort_keys=False by
default, and the globals `raise_exception` (raises a TemplateError with the message) and `strftime_now` (the
local time through strftime). The variables are messages, tools, documents (None), add_generation_prompt, the
special tokens and the extra keyword arguments, as apply_chat_template passes them.

Exit status: 0 rendered (the text on stdout, no newline added), 1 the template raised (message on stderr),
77 python3-jinja2 is not installed (the C++ test then skips, naming the reason).
"""

import json
import sys
from datetime import datetime

try:
    import jinja2
    import jinja2.ext
    import jinja2.sandbox
except ImportError:
    sys.stderr.write("python3-jinja2 is not installed (apt-get install python3-jinja2)\n")
    sys.exit(77)


class _GenerationTag(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %}: transformers' AssistantTracker marks the assistant's tokens with it;
    the text rendered is the body's, which is all a prompt needs."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


def main():
    if len(sys.argv) != 2:
        sys.stderr.write("usage: render_template.py TEMPLATE_FILE < request.json\n")
        return 2
    with open(sys.argv[1], encoding="utf-8") as f:
        source = f.read()
    request = json.loads(sys.stdin.buffer.read().decode("utf-8"))

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now

    variables = dict(request.get("extra") or {})
    variables.update(
        messages=request["messages"],
        tools=request.get("tools"),
        documents=None,
        add_generation_prompt=bool(request.get("add_generation_prompt")),
        bos_token=request.get("bos_token", ""),
        eos_token=request.get("eos_token", ""),
    )
    try:
        text = env.from_string(source).render(**variables)
    except jinja2.exceptions.TemplateError as e:
        sys.stderr.write(f"template error: {e}\n")
        return 1
    sys.stdout.buffer.write(text.encode("utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
