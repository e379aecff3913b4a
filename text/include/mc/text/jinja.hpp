// mc::text::jinja: a small Jinja2 engine for the chat templates of Hugging Face models (DESIGN.md §15, "Chat
// templates"). Renders byte-identically to Python's jinja2 as transformers' apply_chat_template configures it
// (ImmutableSandboxedEnvironment, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False, the
// loopcontrols extension, transformers' `tojson`, `raise_exception` and `strftime_now`), for the constructs
// those templates use; checked against jinja2 itself in tests/text/chat_template_test.cpp.
//
// Covered:
//   - delimiters {{ }}, {% %}, {# #}; whitespace control `-` and `+` on either side; trim_blocks, lstrip_blocks;
//     one trailing newline of the source dropped; \r\n and \r in the source read as \n.
//   - statements: if/elif/else, for (tuple targets, `if` filter, `else`, loop.index/index0/revindex/revindex0/
//     first/last/length/previtem/nextitem/depth), break/continue, set (names, tuples, `ns.attr`, block set),
//     macro (positional/keyword arguments with defaults) and calls of macros, generation/endgeneration (rendered
//     as its body, as transformers' AssistantTracker does when it does not track).
//   - expressions: literals (strings with Python escapes, ints, floats, true/false/none in either case, lists,
//     tuples, dicts), `.attr` and `[key]` (each falling back to the other as jinja2 does), slices with steps,
//     calls, filters, tests (`is`, `is not`), `in`/`not in`, + - * / // % ** ~, comparisons, and/or/not,
//     `a if c else b`.
//   - globals: namespace(), range(), dict(), raise_exception(msg), strftime_now(fmt).
//   - filters: abs, capitalize, count, d/default, first, float, indent, int, items, join, last, length, list,
//     lower, map, reject, rejectattr, replace, reverse, safe, select, selectattr, sort, string, sum, title,
//     tojson, trim, unique, upper, wordcount.
//   - tests: boolean, callable, defined, divisibleby, eq/equalto/==, even, false, float, ge, gt, in, integer,
//     iterable, le, lower, lt, mapping, ne, none, number, odd, sameas, sequence, string, true, undefined, upper.
//   - methods: str: capitalize, count, endswith, find, join, lower, lstrip, replace, rstrip, split, splitlines,
//     startswith, strip, title, upper; dict: get, items, keys, values.
//
// Refused at parse time (an error naming the construct and its line): any other statement (extends, block,
// include, import, raw, call, filter, with, ...), any other filter or test, a call of a name that is neither a
// macro of the template nor a global above, a method name outside the lists above.
//
// Limits (documented differences from Python):
//   - integers are 64-bit (overflow is an error); floats print as Python's repr does.
//   - strings follow Python's str over all of Unicode, as of the Unicode version of the Python that generated
//     text/src/unicode_data.inc (Debian 12's python3: Unicode 14.0.0): whitespace is str.isspace() (|trim,
//     strip/lstrip/rstrip and split without arguments), line boundaries are str.splitlines()'s (splitlines,
//     |indent), and upper/lower/title/capitalize (filters and methods, and sort/unique without case_sensitive)
//     use Python's full case mappings of every code point, the multi-character ones (ß -> SS, ŉ -> ʼN, ﬃ -> FFI,
//     İ -> i̇, ...), title case (ǆ -> ǅ) and lower's final sigma included. |title is jinja2's own (words begin
//     after runs of '-', whitespace, '(', '{', '[', '<'). The tests `lower` and `upper` still look at ASCII
//     letters only. Bytes that are not well-formed UTF-8 pass through these operations unchanged.
//   - a filter that yields a generator in jinja2 (select, map, ...) yields a list here: the same when iterated,
//     joined or passed to `list`, different only when printed bare (jinja2 prints "<generator object ...>").
//   - dict keys are strings; objects keep the key order of the JSON given to render (nlohmann::json sorts keys:
//     pass nlohmann::ordered_json to keep a client's order, as Python does).
//   - attribute access on an undefined value is an error, as in jinja2's default Undefined; printing one is ''.
//
// Work is bounded (Limits): output bytes, evaluation steps (each expression node, statement and loop
// iteration), the depth of macro calls and of the parse, and the size of any one string or list built. Going
// past a bound is an error (kResourceExhausted), never a hang. Errors name the template line.
//
// Thread-safety: a parsed Template is immutable; render() is const and may run on many threads at once. Copies
// share the parsed tree.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "mc/common/status.hpp"

namespace mc::text::jinja {

// Bounds on the work one render may do.
struct Limits {
  size_t max_output_bytes = size_t{8} << 20;  // the rendered text
  uint64_t max_steps = 5'000'000;             // expression nodes + statements + loop iterations
  int max_call_depth = 64;                    // nested macro calls
  size_t max_value_size = size_t{8} << 20;    // bytes of one string, elements of one list built by the template
};

namespace detail {
struct Program;  // the parsed tree (jinja_internal.hpp)
}

class Template {
 public:
  // Parses `source`; `name` is used in messages ("chat template of /models/x"). kInvalidArgument names the line
  // and the construct for a syntax error or anything this engine does not implement.
  static Result<Template> parse(const std::string& source, const std::string& name = "template",
                                Limits limits = Limits{});

  // Renders with `variables` (a JSON object: each member a template variable). A template's
  // raise_exception(msg) is kInvalidArgument whose message contains msg; a runaway template is
  // kResourceExhausted; any other runtime error (undefined attribute, type error) is kInvalidArgument naming
  // the line.
  Result<std::string> render(const nlohmann::json& variables) const;
  Result<std::string> render(const nlohmann::ordered_json& variables) const;

  const std::string& name() const;

 private:
  explicit Template(std::shared_ptr<const detail::Program> program) : program_(std::move(program)) {}
  std::shared_ptr<const detail::Program> program_;
};

}  // namespace mc::text::jinja
