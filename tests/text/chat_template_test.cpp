// mc::text::jinja and mc::text::ChatTemplate: the real chat templates of Llama 3.2/3.3, Qwen2.5, Qwen3 and
// Mistral Nemo (tests/text/templates/) rendered byte-identically to Python's jinja2 as transformers configures it
// (tests/text/render_template.py), small templates exercising each construct against jinja2 too, and the
// engine's errors and bounds.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "mc/text/chat_template.hpp"
#include "mc/text/jinja.hpp"

namespace MC_UNITY_ID {

using mc::text::ChatTemplate;
using mc::text::jinja::Template;
using nlohmann::json;
namespace fs = std::filesystem;

const fs::path kHere = fs::path(__FILE__).parent_path();

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void spit(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary);
  out << s;
}

// The reference: jinja2 through render_template.py. Returns the exit status (77: jinja2 missing) and the text.
struct Reference {
  int status = -1;
  std::string text;
  std::string err;
};

Reference python_render(const std::string& source, const json& request) {
  const fs::path dir = fs::temp_directory_path() / ("mc_jinja_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  spit(dir / "t.jinja", source);
  spit(dir / "req.json", request.dump());
  const std::string cmd = "/usr/bin/python3 '" + (kHere / "render_template.py").string() + "' '" +
                          (dir / "t.jinja").string() + "' < '" + (dir / "req.json").string() + "' > '" +
                          (dir / "out.txt").string() + "' 2> '" + (dir / "err.txt").string() + "'";
  const int rc = std::system(cmd.c_str());
  Reference r;
  r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  r.text = slurp(dir / "out.txt");
  r.err = slurp(dir / "err.txt");
  fs::remove_all(dir);
  return r;
}

// Renders with mc and with jinja2; byte-identical, or both fail (jinja2 raising, mc returning an error).
void expect_same(const std::string& source, const json& messages, const json& tools, bool add_generation_prompt,
                 const json& extra, const std::string& bos, const std::string& eos, const std::string& what) {
  SCOPED_TRACE(what);
  const json request = {{"messages", messages}, {"tools", tools},   {"add_generation_prompt", add_generation_prompt},
                        {"bos_token", bos},     {"eos_token", eos}, {"extra", extra}};
  const Reference ref = python_render(source, request);
  if (ref.status == 77) GTEST_SKIP() << "python3-jinja2 is not installed: " << ref.err;
  auto tmpl = ChatTemplate::from_string(source, bos, eos);
  ASSERT_TRUE(tmpl.is_ok()) << tmpl.status().to_string();
  auto mine = tmpl.value().render(messages, tools, add_generation_prompt, extra);
  if (ref.status != 0) {
    EXPECT_FALSE(mine.is_ok()) << "jinja2 failed (" << ref.err << ") but mc rendered:\n" << mine.value();
    return;
  }
  ASSERT_TRUE(mine.is_ok()) << mine.status().to_string() << "\njinja2 rendered:\n" << ref.text;
  EXPECT_EQ(mine.value(), ref.text);
}

json msg(const std::string& role, const json& content) { return {{"role", role}, {"content", content}}; }

json weather_tools() {
  return json::array({{{"type", "function"},
                       {"function",
                        {{"name", "get_weather"},
                         {"description", "Get the weather in a city — «aujourd'hui»"},
                         {"parameters",
                          {{"type", "object"},
                           {"properties", {{"city", {{"type", "string"}, {"description", "The city, e.g. Zürich"}}}}},
                           {"required", {"city"}}}}}}}});
}

struct Conversation {
  std::string name;
  json messages;
  json tools = nullptr;
  bool add_generation_prompt = true;
  json extra = json::object();
};

std::vector<Conversation> conversations(bool with_tools) {
  std::vector<Conversation> c;
  c.push_back({"system+user", json::array({msg("system", "You are terse."), msg("user", "Hello!")})});
  c.push_back({"multi-turn, no prompt",
               json::array({msg("system", "  Be kind.  "), msg("user", "Hi"),
                            msg("assistant", "Hello, how can I help?"), msg("user", "Tell me a joke.")}),
               nullptr, false});
  c.push_back({"multi-turn ending with assistant",
               json::array({msg("user", "Hi"), msg("assistant", "Hello."), msg("user", "2+2?"), msg("assistant", "4")}),
               nullptr, false});
  c.push_back({"no system", json::array({msg("user", "What is the capital of France?")})});
  c.push_back({"unicode and jinja-looking content",
               json::array({msg("system", "Réponds en français 🙂"),
                            msg("user", "{{ x }} {% if true %}yes{% endif %} {# c #} 日本語 \"quotes\" \\ back\n\ttab"),
                            msg("assistant", "{{ messages }} ✓"), msg("user", "{%- raw %}{{'a'}}")})});
  if (with_tools) {
    json call = {
        {"role", "assistant"},
        {"content", nullptr},
        {"tool_calls", json::array({{{"id", "call12345"},
                                     {"type", "function"},
                                     {"function", {{"name", "get_weather"}, {"arguments", {{"city", "Zürich"}}}}}}})}};
    json result = {
        {"role", "tool"}, {"tool_call_id", "call12345"}, {"content", "{\"temp_c\": 21, \"sky\": \"clear\"}"}};
    c.push_back({"tools listed", json::array({msg("system", "Use tools."), msg("user", "Weather in Zürich?")}),
                 weather_tools()});
    c.push_back({"tool call and result",
                 json::array({msg("system", "Use tools."), msg("user", "Weather in Zürich?"), call, result}),
                 weather_tools()});
  }
  return c;
}

void check_model(const std::string& file, const std::string& bos, const std::string& eos, bool with_tools,
                 const json& extra = json::object()) {
  const std::string source = slurp(kHere / "templates" / file);
  ASSERT_FALSE(source.empty()) << file;
  for (auto& c : conversations(with_tools)) {
    json e = extra;
    for (auto it = c.extra.begin(); it != c.extra.end(); ++it) e[it.key()] = it.value();
    expect_same(source, c.messages, c.tools, c.add_generation_prompt, e, bos, eos, file + ": " + c.name);
    if (::testing::Test::HasFatalFailure() || ::testing::Test::IsSkipped()) return;
  }
}

TEST(ChatTemplateModels, Llama32MatchesJinja2) {
  check_model("meta-llama-Llama-3.2-3B-Instruct.jinja", "<|begin_of_text|>", "<|eot_id|>", true,
              {{"date_string", "26 Jul 2024"}});
  // `message['content'] | trim` strips what Python's str.isspace() calls space: U+3000, U+00A0, U+2003 too.
  const std::string source = slurp(kHere / "templates" / "meta-llama-Llama-3.2-3B-Instruct.jinja");
  expect_same(source, json::array({msg("system", "\u00a0 Be brief.\u2003\n"), msg("user", "\u3000こんにちは\u3000")}),
              nullptr, true, {{"date_string", "26 Jul 2024"}}, "<|begin_of_text|>", "<|eot_id|>",
              "llama 3.2 unicode whitespace");
}

TEST(ChatTemplateModels, Llama33MatchesJinja2) {
  check_model("meta-llama-Llama-3.3-70B-Instruct.jinja", "<|begin_of_text|>", "<|eot_id|>", true,
              {{"date_string", "26 Jul 2024"}});
  // builtin_tools: the ipython branch (items filter, reject, <|eom_id|>).
  const std::string source = slurp(kHere / "templates" / "meta-llama-Llama-3.3-70B-Instruct.jinja");
  json call = {
      {"role", "assistant"},
      {"content", nullptr},
      {"tool_calls", json::array({{{"type", "function"},
                                   {"function", {{"name", "brave_search"}, {"arguments", {{"query", "mc"}}}}}}})}};
  expect_same(source, json::array({msg("user", "search"), call, msg("tool", "result text")}), nullptr, true,
              {{"date_string", "1 Jan 2025"}, {"builtin_tools", {"brave_search", "code_interpreter"}}},
              "<|begin_of_text|>", "<|eot_id|>", "llama 3.3 builtin tools");
}

TEST(ChatTemplateModels, Qwen25MatchesJinja2) { check_model("Qwen-Qwen2.5-7B-Instruct.jinja", "", "<|im_end|>", true); }

TEST(ChatTemplateModels, Qwen3MatchesJinja2) {
  check_model("Qwen-Qwen3-0.6B.jinja", "", "<|im_end|>", true);
  check_model("Qwen-Qwen3-0.6B.jinja", "", "<|im_end|>", true, {{"enable_thinking", false}});
  const std::string source = slurp(kHere / "templates" / "Qwen-Qwen3-0.6B.jinja");
  // Reasoning kept only after the last user query; string tool arguments printed as given.
  json call = {
      {"role", "assistant"},
      {"content", "<think>\nlook it up\n</think>\n\nLet me check."},
      {"tool_calls", json::array({{{"type", "function"},
                                   {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Oslo\"}"}}}}})}};
  expect_same(source,
              json::array({msg("user", "Hi"), msg("assistant", "<think>\nhmm\n</think>\n\nHello!"),
                           msg("user", "Weather in Oslo?"), call, msg("tool", "cold"), msg("tool", "windy")}),
              weather_tools(), true, json::object(), "", "<|im_end|>", "qwen3 thinking and tools");
}

TEST(ChatTemplateModels, MistralNemoMatchesJinja2) {
  check_model("mistralai-Mistral-Nemo-Instruct-2407.jinja", "<s>", "</s>", true);
  // The template's own check: roles must alternate; raise_exception's message reaches the caller.
  const std::string source = slurp(kHere / "templates" / "mistralai-Mistral-Nemo-Instruct-2407.jinja");
  auto tmpl = ChatTemplate::from_string(source, "<s>", "</s>");
  ASSERT_TRUE(tmpl.is_ok());
  auto r = tmpl.value().render(json::array({msg("user", "a"), msg("user", "b")}), nullptr, true);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("conversation roles must alternate"), std::string::npos)
      << r.status().to_string();
}

// Small templates, one construct each, against jinja2.
TEST(JinjaEngine, ConstructsMatchJinja2) {
  const json messages = json::array({msg("system", "sys"), msg("user", "Hello World"), msg("assistant", "ok")});
  const json extra = {{"n", 3},
                      {"f", 2.5},
                      {"tiny", 0.00001},
                      {"big", 1e20},
                      {"s", "  Mixed Case text  "},
                      {"d", {{"b", 1}, {"a", {1, 2, nullptr, true}}, {"c", "é\n\"x\""}}},
                      {"l", {3, 1, 2}},
                      {"nil", nullptr},
                      // Python's whitespace (str.isspace) and line boundaries (str.splitlines), beyond ASCII.
                      {"ws", "\u3000\u00a0\u2003 x\u0085y\u1680 z\x1c\u205f\t\u3000"},
                      {"lines", "a\nb\r\nc\rd\ve\ff\x1cg\x1dh\x1ei\u0085j\u2028k\u2029l\x1fm\n\n"},
                      // Python's full case mappings: several characters (ß, ŉ, ǰ, ΐ, ﬀ-ﬆ, İ), title case (ǅ),
                      // final sigma, Greek, Cyrillic, Armenian, Georgian, Cherokee, Deseret.
                      {"cased",
                       "éß ŉ ǰ ΐ ﬀﬁﬂﬃﬄﬅﬆ ǅ ǈ Ǉ ǳ İ ΑΣ ΟΔΟΣ. ΣΑΣ'Σ Σ 1Σ ΑΣ\u0301Α ᾳ ÆØÅ ĳ Привет ԱԲ "
                       "և Ⴀ ა ᏸ 𐐀 𐐨"},
                      {"t", "o'neil mc-donald(aB) x{y[z<w\tq hello\u3000wORLD ǆemal ßa ΑΣ ŉx 1st 2ND"}};
  const std::vector<std::string> snippets = {
      "{{ 'a' ~ 1 ~ none ~ true }}|{{ 1 + 2 * 3 - 4 // 3 }}|{{ 7 / 2 }}|{{ -7 // 2 }}|{{ -7 % 3 }}|{{ 2 ** 10 }}",
      "{{ f }} {{ tiny }} {{ big }} {{ 1.0 }} {{ 0.1 + 0.2 }} {{ 3 / 3 }}",
      "{{ d }} {{ l }} {{ (1, 'a') }} {{ nil }} {{ undefined_var }}.",
      "{{ d | tojson }}\n{{ d | tojson(indent=2) }}\n{{ l | tojson(indent=4) }}\n{{ [] | tojson(indent=2) }}",
      "{{ d | tojson(sort_keys=true) }}{{ {'z': 1, 'a': [{}, []]} | tojson }}{{ 'x\u00e9\\u2028' | tojson }}",
      "{% for m in messages %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/"
      "{{ loop.first }}/{{ loop.last }}/{{ loop.length }}:{{ m.role }};{% endfor %}",
      "{% for x in [] %}no{% else %}empty{% endfor %}{% for x in l if x > 1 %}{{ x }}{{ loop.length }}{% endfor %}",
      "{% for x in l %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor "
      "%}",
      "{% if n > 5 %}big{% elif n > 2 %}mid{% else %}small{% endif %}",
      "{% set ns = namespace(count=0, seen='') %}{% for m in messages %}{% set ns.count = ns.count + 1 %}"
      "{% set ns.seen = ns.seen + m.role[0] %}{% endfor %}{{ ns.count }} {{ ns.seen }}",
      "{% set x = 1 %}{% for i in l %}{% set x = i %}{% endfor %}{{ x }}",
      "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set blk %}in {{ n }} block{% endset %}[{{ blk }}]",
      "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} "
      "{{ greet(punct='.', name='C') }}",
      "{{ s | trim }}|{{ s | upper }}|{{ s | lower }}|{{ s | title }}|{{ s | capitalize }}|{{ s | length }}",
      "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.split() }}|{{ 'a,b,,c'.split(',') }}|"
      "{{ 'a b c'.split(' ', 1) }}|{{ 'xxhixx'.strip('x') }}",
      "{{ 'hello'.startswith('he') }}{{ 'hello'.endswith(('x', 'lo')) }}{{ 'hello'.replace('l', 'L') }}"
      "{{ 'hello' | replace('l', 'L', 1) }}{{ 'a-b'.title() }}{{ 'hello'.upper() }}",
      // Whitespace, line boundaries, strip sets of code points, and case mapping, all as Python's str.
      "{{ ws | trim }}|{{ ws.strip() }}|{{ ws.lstrip() }}|{{ ws.rstrip() }}|{{ ws.split() | join('/') }}|"
      "{{ ws.split(none, 1) | join('/') }}|{{ 'a b  '.split(none, 1) | join('/') }}|"
      "{{ '  a b '.split(none, 0) | join('/') }}|{{ ws | trim('\u3000') }}",
      "{{ lines.splitlines() | join('|') }}#{{ lines | indent(2) }}#{{ lines | indent(1, true, true) }}",
      "{{ 'xéxhéx'.strip('xé') }}|{{ 'ééaéé'.lstrip('é') }}|{{ 'aè'.rstrip('é') }}|{{ 'èaè' | trim('é') }}",
      "{{ cased | upper }}|{{ cased | lower }}|{{ cased | capitalize }}|{{ cased | title }}",
      "{{ cased.upper() }}|{{ cased.lower() }}|{{ cased.title() }}|{{ cased.capitalize() }}|"
      "{{ 'ǅx'.capitalize() }}{{ 'ßa'.capitalize() }}{{ 'ΣΑΣ'.capitalize() }}",
      "{{ t | title }}|{{ t.title() }}|{{ \"o'neil\" | title }}|{{ \"o'neil\".title() }}|{{ '' | title }}",
      "{{ ['É', 'e', 'Z', 'é', 'a'] | sort | join }}{{ ['É', 'é', 'E'] | unique | join }}",
      "{{ 'hello'[1] }}{{ 'hello'[-1] }}{{ 'hello'[1:3] }}{{ 'hello'[::-1] }}{{ l[::-1] }}{{ l[1:] }}{{ l[:-1] }}"
      "{{ 'héllo'[1:3] }}{{ 'héllo' | length }}{{ l[::2] }}",
      "{{ messages[0]['role'] }} {{ messages[0].content }} {{ messages[-1]['content'] }} {{ d.a[1] }} {{ d['c'] }}",
      "{{ messages | selectattr('role', 'equalto', 'user') | list | length }}"
      "{{ messages | rejectattr('role', 'eq', 'user') | map(attribute='role') | join(',') }}"
      "{{ messages | map(attribute='content') | first }}{{ messages | last }}",
      "{% for k, v in d | items %}{{ k }}={{ v }};{% endfor %}{% for k, v in d.items() %}{{ k }}{% endfor %}"
      "{{ d.keys() | list }}{{ d.get('zz', 'dflt') }}{{ d.get('b') }}",
      "{{ undefined_var | default('dflt') }}{{ '' | default('e', true) }}{{ nil | default('n') }}"
      "{{ '42' | int + 1 }}{{ 'x' | int }}{{ 3.9 | int }}{{ 2 | float }}{{ 5 | string }}{{ 'a' | safe }}",
      "{{ x is defined }}{{ x is undefined }}{{ nil is none }}{{ s is string }}{{ d is mapping }}"
      "{{ l is iterable }}{{ s is iterable }}{{ n is iterable }}{{ l is sequence }}{{ n is number }}"
      "{{ true is true }}{{ false is false }}{{ 0 is false }}{{ n is not none }}{{ n is odd }}{{ 4 is divisibleby 2 }}",
      "{{ 'a' in 'cat' }}{{ 2 in l }}{{ 'b' in d }}{{ 'q' not in d }}{{ 5 not in l }}",
      "{{ 'y' if n > 1 else 'n' }}{{ 'y' if n > 9 }}.{{ n > 1 and 'A' or 'B' }}{{ not n }}{{ nil or 'dflt' }}",
      "{{ [1, 2] + [3] }}{{ 'ab' * 3 }}{{ {'k': [1, {'j': 'v'}]} }}{{ (1,) }}{{ range(3) | list }}{{ range(1, 7, 2) | "
      "list }}",
      "{{ 'line1\nline2\n\nline3' | indent(2) }}|{{ 'a\nb' | indent(4, true) }}|{{ l | sort }}{{ l | "
      "sort(reverse=true) }}"
      "{{ [1, 2, 1] | unique | list }}{{ l | sum }}{{ 'a b  c' | wordcount }}{{ l | reverse | list }}",
      "A\n  {% if true %}\n    B\n  {% endif %}\nC {%- if true %} D {% endif -%}\n E\n{# comment #}\nF\n    {#- c2 "
      "-#}\nG",
      "  {{ 'x' }}\n  {% for i in l %}\n  - {{ i }}\n  {% endfor %}\n{%+ if true %}kept{% endif %}\n{% if true "
      "+%}\nnl{% endif %}",
      "{{ \"a\\tb\\n\" }}{{ 'it''s' }}{{ '\\u00e9\\x41' }}{{ \"q\\\"q\" }}",
      "{{ messages[10] is defined }}{{ d.missing is defined }}{{ s.missing is defined }}{{ l.0 }}",
      "{% generation %}gen{{ n }}{% endgeneration %}",
      "x\n",
      "trailing newlines\n\n",
  };
  for (const auto& snippet : snippets) {
    expect_same(snippet, messages, nullptr, true, extra, "<s>", "</s>", snippet);
    if (IsSkipped()) return;
  }
}

// Every code point of the planes with case mappings (U+0080-1FFFF, no surrogates) through Python's case mapping
// and whitespace: contiguous (lower's final-sigma context, title's cased runs) and each followed by a space (title
// and capitalize then title-case every code point).
TEST(JinjaEngine, CaseMappingAndWhitespaceMatchJinja2ForEveryCodePoint) {
  std::string all, spaced;
  for (uint32_t cp = 0x80; cp <= 0x1FFFF; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    std::string u;
    if (cp < 0x800) {
      u = {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
    } else if (cp < 0x10000) {
      u = {static_cast<char>(0xE0 | (cp >> 12)), static_cast<char>(0x80 | ((cp >> 6) & 0x3F)),
           static_cast<char>(0x80 | (cp & 0x3F))};
    } else {
      u = {static_cast<char>(0xF0 | (cp >> 18)), static_cast<char>(0x80 | ((cp >> 12) & 0x3F)),
           static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), static_cast<char>(0x80 | (cp & 0x3F))};
    }
    all += u;
    spaced += u + " ";
  }
  const json extra = {{"all", all}, {"spaced", spaced}};
  for (const std::string snippet :
       {"{{ all | upper }}", "{{ all | lower }}", "{{ all.title() }}", "{{ all | capitalize }}", "{{ spaced.title() }}",
        "{{ spaced | title }}",
        "{{ all.split() | length }} {{ all.splitlines() | length }} {{ all | trim | length }}"}) {
    expect_same(snippet, json::array(), nullptr, false, extra, "", "", snippet);
    if (IsSkipped()) return;
  }
}

TEST(JinjaEngine, ErrorsCarryLineNumbers) {
  auto bad_filter = Template::parse("line one\n{{ x | frobnicate }}");
  ASSERT_FALSE(bad_filter.is_ok());
  EXPECT_NE(bad_filter.status().message().find("line 2"), std::string::npos) << bad_filter.status().to_string();
  EXPECT_NE(bad_filter.status().message().find("frobnicate"), std::string::npos);

  auto bad_tag = Template::parse("a\nb\n{% include 'x.html' %}");
  ASSERT_FALSE(bad_tag.is_ok());
  EXPECT_NE(bad_tag.status().message().find("line 3"), std::string::npos) << bad_tag.status().to_string();
  EXPECT_NE(bad_tag.status().message().find("include"), std::string::npos);

  for (const char* src : {"{% if x %}open", "{{ x ", "{{ 'abc }}", "{% for %}{% endfor %}", "{{ x is frob }}",
                          "{{ unknown_fn(1) }}", "{{ 'a'.format(1) }}", "{% break %}", "{{ ((((( }}", "{# open"}) {
    auto r = Template::parse(src);
    EXPECT_FALSE(r.is_ok()) << src;
    if (!r.is_ok()) EXPECT_NE(r.status().message().find("line 1"), std::string::npos) << r.status().to_string();
  }

  auto runtime = Template::parse("ok\n\n{{ nothing.attr }}");
  ASSERT_TRUE(runtime.is_ok());
  auto r = runtime.value().render(json::object());
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("line 3"), std::string::npos) << r.status().to_string();
  EXPECT_NE(r.status().message().find("nothing"), std::string::npos);
}

TEST(JinjaEngine, RaiseExceptionMessageSurfaces) {
  auto t = Template::parse("{{ raise_exception('Only user and assistant roles are supported!') }}");
  ASSERT_TRUE(t.is_ok());
  auto r = t.value().render(json::object());
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), mc::Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("Only user and assistant roles are supported!"), std::string::npos);
}

TEST(JinjaEngine, RunawayTemplatesAreBounded) {
  mc::text::jinja::Limits small;
  small.max_steps = 100'000;
  small.max_output_bytes = 1 << 16;
  // Nested loops: 10^15 iterations without the bound.
  auto loops = Template::parse(
      "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}{% endfor %}{% endfor %}"
      "{% endfor %}",
      "t", small);
  ASSERT_TRUE(loops.is_ok());
  auto r = loops.value().render(json::object());
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), mc::Code::kResourceExhausted) << r.status().to_string();

  auto output = Template::parse("{% for a in range(100000) %}xxxxxxxxxxxxxxxxxxxx{% endfor %}", "t", small);
  ASSERT_TRUE(output.is_ok());
  r = output.value().render(json::object());
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), mc::Code::kResourceExhausted);

  auto recursion = Template::parse("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  ASSERT_TRUE(recursion.is_ok());
  r = recursion.value().render(json::object());
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), mc::Code::kResourceExhausted);

  auto doubling = Template::parse(
      "{% set ns = namespace(s='ab') %}{% for i in range(100) %}{% set ns.s = ns.s + ns.s %}"
      "{% endfor %}");
  ASSERT_TRUE(doubling.is_ok());
  r = doubling.value().render(json::object());
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), mc::Code::kResourceExhausted);

  auto repeat = Template::parse("{{ 'x' * 1000000000000 }}");
  ASSERT_TRUE(repeat.is_ok());
  EXPECT_FALSE(repeat.value().render(json::object()).is_ok());
}

TEST(JinjaEngine, MessageContentIsNeverTemplateCode) {
  auto t = ChatTemplate::from_string("{% for m in messages %}[{{ m.content }}]{% endfor %}", "", "");
  ASSERT_TRUE(t.is_ok());
  auto r =
      t.value().render(json::array({msg("user", "{{ raise_exception('boom') }}{% for x in y %}")}), nullptr, false);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r.value(), "[{{ raise_exception('boom') }}{% for x in y %}]");
}

TEST(JinjaEngine, OrderedJsonKeepsTheClientsKeyOrder) {
  auto t = ChatTemplate::from_string("{{ tools[0] | tojson }}|{{ tools[0] | tojson(sort_keys=true) }}", "", "");
  ASSERT_TRUE(t.is_ok());
  const auto tools = nlohmann::ordered_json::parse(R"([{"z": 1, "a": {"y": 2, "b": 3}}])");
  auto r = t.value().render(nlohmann::ordered_json::array(), tools, false);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r.value(), R"({"z": 1, "a": {"y": 2, "b": 3}}|{"a": {"b": 3, "y": 2}, "z": 1})");
}

TEST(ChatTemplateLoad, ReadsModelDirectories) {
  const fs::path dir = fs::temp_directory_path() / ("mc_chat_template_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  // No template at all.
  spit(dir / "tokenizer_config.json", R"({"bos_token": "<s>"})");
  auto none = ChatTemplate::load(dir.string());
  ASSERT_FALSE(none.is_ok());
  EXPECT_EQ(none.status().code(), mc::Code::kNotFound);
  // A string template with AddedToken-style special tokens.
  spit(dir / "tokenizer_config.json",
       R"({"chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}",
           "bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>"})");
  auto simple = ChatTemplate::load(dir.string());
  ASSERT_TRUE(simple.is_ok()) << simple.status().to_string();
  EXPECT_EQ(simple.value().render(json::array({msg("user", "hi")}), nullptr, false).value(), "<s>hi</s>");
  // A list of named templates: "default" is used.
  spit(dir / "tokenizer_config.json",
       R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})");
  auto named = ChatTemplate::load(dir.string());
  ASSERT_TRUE(named.is_ok()) << named.status().to_string();
  EXPECT_EQ(named.value().render(json::array(), nullptr, false).value(), "D");
  // chat_template.jinja wins; an unsupported construct is a load-time error naming the file and line.
  spit(dir / "chat_template.jinja", "ok\n{{ messages | frobnicate }}");
  auto bad = ChatTemplate::load(dir.string());
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("chat_template.jinja"), std::string::npos) << bad.status().to_string();
  EXPECT_NE(bad.status().message().find("line 2"), std::string::npos);
  EXPECT_NE(bad.status().message().find("frobnicate"), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace MC_UNITY_ID
