// mc::text::jinja: the lexer and the parser (source text to the tree of jinja_internal.hpp) and the Template
// entry points. The evaluator is jinja_eval.cpp.
#include "mc/text/jinja.hpp"

#include <cstdlib>
#include <set>
#include <string_view>

#include "jinja_internal.hpp"

namespace mc::text::jinja {

namespace detail {
namespace jinja_parse {

// ---- lexer ----

enum class Tok : uint8_t { kData, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEnd };

struct Token {
  Tok type = Tok::kEnd;
  int line = 0;
  std::string text;  // data, name, operator, or the decoded string literal
  int64_t i = 0;
  double f = 0;
};

struct ParseError {
  int line;
  std::string message;
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

class Lexer {
 public:
  explicit Lexer(std::string_view src) : src_(src) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t at = find_tag(pos_);
      std::string text(src_.substr(pos_, at - pos_));
      const int text_line = line_;
      count_lines(pos_, at);
      if (at == src_.size()) {
        push_data(std::move(text), text_line);
        break;
      }
      const char kind = src_[at + 1];
      const char mod = at + 2 < src_.size() ? src_[at + 2] : '\0';
      if (mod == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (mod != '+' && (kind == '%' || kind == '#')) {
        // lstrip_blocks: spaces and tabs between the start of a line and a block or comment tag go.
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        const bool at_line_start = l_pos > 0 || (line_starting && pos_ == at - text.size());
        if (at_line_start && l_pos < text.size()) {
          bool blank = true;
          for (size_t k = l_pos; k < text.size(); ++k) blank = blank && is_space(text[k]) && text[k] != '\n';
          if (blank) text.resize(l_pos);
        }
      }
      push_data(std::move(text), text_line);
      pos_ = at + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      if (kind == '#') {
        lex_comment();
      } else {
        lex_tag(kind);
      }
      line_starting = pos_ > 0 && src_[pos_ - 1] == '\n';
    }
    tokens_.push_back(Token{Tok::kEnd, line_, {}, 0, 0});
    return std::move(tokens_);
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t k = from; k + 1 < src_.size(); ++k) {
      if (src_[k] == '{' && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#')) return k;
    }
    return src_.size();
  }
  void count_lines(size_t from, size_t to) {
    for (size_t k = from; k < to && k < src_.size(); ++k) line_ += src_[k] == '\n' ? 1 : 0;
  }
  void push_data(std::string text, int line) {
    if (!text.empty()) tokens_.push_back(Token{Tok::kData, line, std::move(text), 0, 0});
  }
  // After a closing delimiter: `-` strips all following whitespace; for blocks and comments trim_blocks drops
  // one newline unless `+` asked to keep it.
  void after_close(bool minus, bool plus, bool block_like) {
    if (minus) {
      size_t k = pos_;
      while (k < src_.size() && is_space(src_[k])) ++k;
      count_lines(pos_, k);
      pos_ = k;
    } else if (block_like && !plus && pos_ < src_.size() && src_[pos_] == '\n') {
      ++line_;
      ++pos_;
    }
  }

  void lex_comment() {
    const int start_line = line_;
    const size_t end = src_.find("#}", pos_);
    if (end == std::string_view::npos) throw ParseError{start_line, "comment {# ... is never closed with #}"};
    const bool minus = end > pos_ && src_[end - 1] == '-';
    const bool plus = end > pos_ && src_[end - 1] == '+';
    count_lines(pos_, end + 2);
    pos_ = end + 2;
    after_close(minus, plus, true);
  }

  void lex_tag(char kind) {
    const bool block = kind == '%';
    tokens_.push_back(Token{block ? Tok::kBlockBegin : Tok::kVarBegin, line_, {}, 0, 0});
    const int start_line = line_;
    int depth = 0;  // brackets open inside the tag: `}}` closes a variable only outside them
    for (;;) {
      while (pos_ < src_.size() && is_space(src_[pos_])) {
        line_ += src_[pos_] == '\n' ? 1 : 0;
        ++pos_;
      }
      if (pos_ >= src_.size()) {
        throw ParseError{start_line, std::string(block ? "{% tag" : "{{ expression") + " is never closed"};
      }
      const std::string_view rest = src_.substr(pos_);
      const char close = block ? '%' : '}';
      for (const char m : {'-', '+', '\0'}) {
        std::string closer;
        if (m != '\0') closer += m;
        closer += close;
        closer += '}';
        if ((depth == 0 || block) && rest.starts_with(closer) && !(m == '+' && !block)) {
          pos_ += closer.size();
          tokens_.push_back(Token{block ? Tok::kBlockEnd : Tok::kVarEnd, line_, {}, 0, 0});
          after_close(m == '-', m == '+', block);
          return;
        }
      }
      lex_expr_token(depth);
    }
  }

  void lex_expr_token(int& depth) {
    const char c = src_[pos_];
    if (is_name_start(c)) {
      size_t k = pos_;
      while (k < src_.size() && is_name_char(src_[k])) ++k;
      tokens_.push_back(Token{Tok::kName, line_, std::string(src_.substr(pos_, k - pos_)), 0, 0});
      pos_ = k;
      return;
    }
    if (is_digit(c)) {
      size_t k = pos_;
      bool is_float = false;
      while (k < src_.size() && (is_digit(src_[k]) || src_[k] == '_')) ++k;
      if (k + 1 < src_.size() && src_[k] == '.' && is_digit(src_[k + 1])) {
        is_float = true;
        ++k;
        while (k < src_.size() && (is_digit(src_[k]) || src_[k] == '_')) ++k;
      }
      if (k < src_.size() && (src_[k] == 'e' || src_[k] == 'E')) {
        size_t e = k + 1;
        if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
        if (e < src_.size() && is_digit(src_[e])) {
          is_float = true;
          k = e;
          while (k < src_.size() && is_digit(src_[k])) ++k;
        }
      }
      std::string digits;
      for (size_t q = pos_; q < k; ++q) {
        if (src_[q] != '_') digits += src_[q];
      }
      Token t{is_float ? Tok::kFloat : Tok::kInt, line_, digits, 0, 0};
      if (is_float) {
        t.f = std::strtod(digits.c_str(), nullptr);
      } else {
        errno = 0;
        t.i = std::strtoll(digits.c_str(), nullptr, 10);
        if (errno == ERANGE) throw ParseError{line_, "integer literal " + digits + " does not fit in 64 bits"};
      }
      tokens_.push_back(std::move(t));
      pos_ = k;
      return;
    }
    if (c == '\'' || c == '"') {
      tokens_.push_back(Token{Tok::kString, line_, lex_string(c), 0, 0});
      return;
    }
    static constexpr std::string_view kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                                ">",  "=",  "(",  ")",  "[",  "]",  "{", "}", ",", ".", ":", "|"};
    for (const std::string_view op : kOps) {
      if (src_.substr(pos_).starts_with(op)) {
        if (op == "(" || op == "[" || op == "{") ++depth;
        if ((op == ")" || op == "]" || op == "}") && depth > 0) --depth;
        tokens_.push_back(Token{Tok::kOp, line_, std::string(op), 0, 0});
        pos_ += op.size();
        return;
      }
    }
    throw ParseError{line_, std::string("unexpected character '") + c + "' inside a tag"};
  }

  // A string literal with Python's escapes (jinja2 decodes them as unicode-escape).
  std::string lex_string(char quote) {
    const int start_line = line_;
    std::string out;
    size_t k = pos_ + 1;
    for (;;) {
      if (k >= src_.size()) throw ParseError{start_line, "string literal is never closed"};
      const char c = src_[k];
      if (c == quote) break;
      if (c == '\n') ++line_;
      if (c != '\\') {
        out += c;
        ++k;
        continue;
      }
      if (k + 1 >= src_.size()) throw ParseError{start_line, "string literal is never closed"};
      const char e = src_[k + 1];
      k += 2;
      auto hex = [&](int digits) -> uint32_t {
        if (k + digits > src_.size()) throw ParseError{line_, "truncated \\x/\\u escape in a string literal"};
        uint32_t v = 0;
        for (int q = 0; q < digits; ++q) {
          const char h = src_[k + q];
          v *= 16;
          if (h >= '0' && h <= '9') {
            v += h - '0';
          } else if (h >= 'a' && h <= 'f') {
            v += h - 'a' + 10;
          } else if (h >= 'A' && h <= 'F') {
            v += h - 'A' + 10;
          } else {
            throw ParseError{line_, "bad hexadecimal digit in a \\x/\\u escape of a string literal"};
          }
        }
        k += digits;
        return v;
      };
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'v':
          out += '\v';
          break;
        case '0':
          out += '\0';
          break;
        case '\n':
          ++line_;
          break;  // a line continuation
        case 'x':
          append_utf8(out, hex(2));
          break;
        case 'u':
          append_utf8(out, hex(4));
          break;
        case 'U': {
          const uint32_t cp = hex(8);
          if (cp > 0x10FFFF) throw ParseError{line_, "\\U escape past U+10FFFF in a string literal"};
          append_utf8(out, cp);
          break;
        }
        default:  // Python keeps an unknown escape as written
          out += '\\';
          out += e;
      }
    }
    pos_ = k + 1;
    return out;
  }

  std::string_view src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

// ---- parser ----

const std::set<std::string, std::less<>>& known_filters() {
  static const std::set<std::string, std::less<>> k{
      "abs",    "capitalize", "count",   "d",       "default", "first",  "float",      "indent",
      "int",    "items",      "join",    "last",    "length",  "list",   "lower",      "map",
      "reject", "rejectattr", "replace", "reverse", "safe",    "select", "selectattr", "sort",
      "string", "sum",        "title",   "tojson",  "trim",    "unique", "upper",      "wordcount"};
  return k;
}
const std::set<std::string, std::less<>>& known_tests() {
  static const std::set<std::string, std::less<>> k{
      "boolean", "callable", "defined", "divisibleby", "eq",       "equalto", "==",    "even",      "false",   "float",
      "ge",      "gt",       "in",      "integer",     "iterable", "le",      "lower", "lt",        "mapping", "ne",
      "none",    "number",   "odd",     "sameas",      "sequence", "string",  "true",  "undefined", "upper"};
  return k;
}
const std::set<std::string, std::less<>>& known_methods() {
  static const std::set<std::string, std::less<>> k{
      "capitalize", "count",      "endswith", "find",  "join",  "lower", "lstrip", "replace", "rstrip", "split",
      "splitlines", "startswith", "strip",    "title", "upper", "get",   "items",  "keys",    "values"};
  return k;
}
const std::set<std::string, std::less<>>& known_globals() {
  static const std::set<std::string, std::less<>> k{"namespace", "range", "dict", "raise_exception", "strftime_now"};
  return k;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Body parse_template() {
    Body body = parse_body({});
    if (peek().type != Tok::kEnd) fail(peek().line, "unexpected tag");
    // A call must name a macro of this template or a global: checked now, so that it fails at load.
    for (const auto& [name, line] : called_) {
      if (!macros_.contains(name) && !known_globals().contains(name)) {
        fail(line, "call of '" + name +
                       "', which is neither a macro of this template nor a supported global (namespace, range, "
                       "dict, raise_exception, strftime_now)");
      }
    }
    return body;
  }

 private:
  [[noreturn]] static void fail(int line, std::string message) { throw ParseError{line, std::move(message)}; }

  const Token& peek(size_t ahead = 0) const { return t_[std::min(p_ + ahead, t_.size() - 1)]; }
  const Token& next() {
    const Token& t = t_[p_];
    if (p_ + 1 < t_.size()) ++p_;
    return t;
  }
  bool is_op(std::string_view op, size_t ahead = 0) const {
    return peek(ahead).type == Tok::kOp && peek(ahead).text == op;
  }
  bool is_name(std::string_view name, size_t ahead = 0) const {
    return peek(ahead).type == Tok::kName && peek(ahead).text == name;
  }
  void expect_op(std::string_view op) {
    if (!is_op(op)) fail(peek().line, "expected '" + std::string(op) + "', found " + describe(peek()));
    next();
  }
  std::string expect_name() {
    if (peek().type != Tok::kName) fail(peek().line, "expected a name, found " + describe(peek()));
    return next().text;
  }
  void expect_block_end() {
    if (peek().type != Tok::kBlockEnd) fail(peek().line, "expected '%}', found " + describe(peek()));
    next();
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::kData:
        return "text";
      case Tok::kVarBegin:
        return "'{{'";
      case Tok::kVarEnd:
        return "'}}'";
      case Tok::kBlockBegin:
        return "'{%'";
      case Tok::kBlockEnd:
        return "'%}'";
      case Tok::kName:
        return "'" + t.text + "'";
      case Tok::kString:
        return "a string";
      case Tok::kInt:
      case Tok::kFloat:
        return "a number";
      case Tok::kOp:
        return "'" + t.text + "'";
      case Tok::kEnd:
        return "the end of the template";
    }
    return "?";
  }

  // Parses statements until a block tag whose keyword is in `ends` (left unconsumed: the caller reads it).
  Body parse_body(const std::set<std::string, std::less<>>& ends) {
    Body body;
    for (;;) {
      const Token& t = peek();
      if (t.type == Tok::kEnd) {
        if (!ends.empty()) {
          std::string names;
          for (const auto& e : ends) names += (names.empty() ? "" : " or ") + e;
          fail(t.line, "the template ends where {% " + names + " %} was expected (a block is left open)");
        }
        return body;
      }
      if (t.type == Tok::kData) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kText;
        s->line = t.line;
        s->text = t.text;
        next();
        body.push_back(std::move(s));
        continue;
      }
      if (t.type == Tok::kVarBegin) {
        next();
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kOutput;
        s->line = t.line;
        s->expr = parse_expression();
        if (peek().type != Tok::kVarEnd) fail(peek().line, "expected '}}', found " + describe(peek()));
        next();
        body.push_back(std::move(s));
        continue;
      }
      if (t.type != Tok::kBlockBegin) fail(t.line, "unexpected " + describe(t));
      if (peek(1).type == Tok::kName && ends.contains(peek(1).text)) return body;
      next();
      body.push_back(parse_statement());
    }
  }

  StmtPtr parse_statement() {
    const int line = peek().line;
    if (peek().type != Tok::kName) fail(line, "expected a statement name after '{%', found " + describe(peek()));
    const std::string kw = next().text;
    auto s = std::make_unique<Stmt>();
    s->line = line;
    if (kw == "if") {
      s->kind = Stmt::Kind::kIf;
      ExprPtr cond = parse_expression();
      expect_block_end();
      for (;;) {
        Body b = parse_body({"elif", "else", "endif"});
        s->branches.emplace_back(std::move(cond), std::move(b));
        next();  // {%
        const std::string which = next().text;
        if (which == "elif") {
          cond = parse_expression();
          expect_block_end();
          continue;
        }
        if (which == "else") {
          expect_block_end();
          s->else_body = parse_body({"endif"});
          next();
          next();
        }
        expect_block_end();
        break;
      }
    } else if (kw == "for") {
      s->kind = Stmt::Kind::kFor;
      s->targets.push_back(expect_name());
      while (is_op(",")) {
        next();
        s->targets.push_back(expect_name());
      }
      if (!is_name("in")) fail(peek().line, "expected 'in' in a for loop, found " + describe(peek()));
      next();
      s->expr = parse_or_expr(true);  // `if` here is the loop's filter, not an inline if
      if (is_name("if")) {
        next();
        s->cond = parse_expression();
      }
      if (is_name("recursive")) fail(peek().line, "recursive for loops are not supported");
      expect_block_end();
      ++loop_depth_;
      s->body = parse_body({"else", "endfor"});
      --loop_depth_;
      next();
      if (next().text == "else") {
        expect_block_end();
        s->else_body = parse_body({"endfor"});
        next();
        next();
      }
      expect_block_end();
    } else if (kw == "set") {
      const std::string first = expect_name();
      if (is_op(".")) {
        next();
        s->kind = Stmt::Kind::kSet;
        s->targets.push_back(first);
        s->attr = expect_name();
        expect_op("=");
        s->expr = parse_expression();
        expect_block_end();
      } else if (peek().type == Tok::kBlockEnd) {
        s->kind = Stmt::Kind::kSetBlock;
        s->targets.push_back(first);
        next();
        s->body = parse_body({"endset"});
        next();
        next();
        expect_block_end();
      } else {
        s->kind = Stmt::Kind::kSet;
        s->targets.push_back(first);
        while (is_op(",")) {
          next();
          s->targets.push_back(expect_name());
        }
        expect_op("=");
        s->expr = parse_expression();
        if (is_op(",")) {  // set a, b = 1, 2
          auto tuple = std::make_unique<Expr>();
          tuple->kind = Expr::Kind::kTuple;
          tuple->line = line;
          tuple->items.push_back(std::move(s->expr));
          while (is_op(",")) {
            next();
            tuple->items.push_back(parse_expression());
          }
          s->expr = std::move(tuple);
        }
        expect_block_end();
      }
    } else if (kw == "macro") {
      auto m = std::make_shared<Macro>();
      m->line = line;
      m->name = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        m->params.push_back(expect_name());
        if (is_op("=")) {
          next();
          m->defaults.push_back(parse_expression());
        } else {
          m->defaults.push_back(nullptr);
        }
        if (!is_op(")")) expect_op(",");
      }
      next();
      expect_block_end();
      const int saved_loop_depth = loop_depth_;
      loop_depth_ = 0;
      m->body = parse_body({"endmacro"});
      loop_depth_ = saved_loop_depth;
      next();
      next();
      if (peek().type == Tok::kName) next();  // {% endmacro name %}
      expect_block_end();
      macros_.insert(m->name);
      s->kind = Stmt::Kind::kMacro;
      s->targets.push_back(m->name);
      s->macro = std::move(m);
    } else if (kw == "break" || kw == "continue") {
      if (loop_depth_ == 0) fail(line, "{% " + kw + " %} outside a for loop");
      s->kind = kw == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      expect_block_end();
    } else if (kw == "generation") {
      s->kind = Stmt::Kind::kBlock;
      expect_block_end();
      s->body = parse_body({"endgeneration"});
      next();
      next();
      expect_block_end();
    } else {
      fail(line, "the statement {% " + kw +
                     " %} is not supported by mc's Jinja engine (supported: if, for, set, macro, break, continue, "
                     "generation)");
    }
    return s;
  }

  // ---- expressions ----

  struct DepthGuard {
    explicit DepthGuard(Parser& p) : p_(p) {
      if (++p_.depth_ > kMaxDepth) fail(p_.peek().line, "expression nested too deeply (over 100 levels)");
    }
    ~DepthGuard() { --p_.depth_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;
    Parser& p_;
  };
  static constexpr int kMaxDepth = 100;

  ExprPtr make(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  ExprPtr parse_expression() {
    DepthGuard guard(*this);
    ExprPtr e = parse_or_expr(false);
    while (is_name("if")) {
      const int line = next().line;
      auto cond = make(Expr::Kind::kCond, line);
      cond->items.push_back(std::move(e));
      cond->items.push_back(parse_or_expr(false));
      if (is_name("else")) {
        next();
        cond->items.push_back(parse_expression());
      } else {
        cond->items.push_back(nullptr);
      }
      e = std::move(cond);
    }
    return e;
  }

  ExprPtr parse_or_expr(bool /*in_for*/) {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      auto e = make(Expr::Kind::kOr, next().line);
      e->items.push_back(std::move(left));
      e->items.push_back(parse_and());
      left = std::move(e);
    }
    return left;
  }
  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      auto e = make(Expr::Kind::kAnd, next().line);
      e->items.push_back(std::move(left));
      e->items.push_back(parse_not());
      left = std::move(e);
    }
    return left;
  }
  ExprPtr parse_not() {
    DepthGuard guard(*this);
    if (is_name("not")) {
      auto e = make(Expr::Kind::kUnary, next().line);
      e->name = "not";
      e->items.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    ExprPtr left = parse_math1();
    for (;;) {
      std::string op;
      const int line = peek().line;
      if (peek().type == Tok::kOp && (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
                                      peek().text == "<=" || peek().text == ">" || peek().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        next();
        next();
        op = "not in";
      } else {
        return left;
      }
      auto e = make(Expr::Kind::kCompare, line);
      e->name = op;
      e->items.push_back(std::move(left));
      e->items.push_back(parse_math1());
      left = std::move(e);
    }
  }
  ExprPtr binary(std::string op, int line, ExprPtr l, ExprPtr r) {
    auto e = make(Expr::Kind::kBinary, line);
    e->name = std::move(op);
    e->items.push_back(std::move(l));
    e->items.push_back(std::move(r));
    return e;
  }
  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      left = binary(t.text, t.line, std::move(left), parse_concat());
    }
    return left;
  }
  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      const int line = next().line;
      left = binary("~", line, std::move(left), parse_math2());
    }
    return left;
  }
  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      left = binary(t.text, t.line, std::move(left), parse_pow());
    }
    return left;
  }
  ExprPtr parse_pow() {
    ExprPtr left = parse_unary();
    while (is_op("**")) {
      const int line = next().line;
      left = binary("**", line, std::move(left), parse_unary());
    }
    return left;
  }
  ExprPtr parse_unary() {
    DepthGuard guard(*this);
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      auto e = make(Expr::Kind::kUnary, t.line);
      e->name = t.text;
      e->items.push_back(parse_unary());
      return e;
    }
    ExprPtr e = parse_primary();
    e = parse_postfix(std::move(e));
    return parse_filters_and_tests(std::move(e));
  }

  ExprPtr parse_primary() {
    DepthGuard guard(*this);
    const Token& t = peek();
    const int line = t.line;
    if (t.type == Tok::kName) {
      const std::string name = next().text;
      auto e = make(Expr::Kind::kLiteral, line);
      if (name == "true" || name == "True") {
        e->value = Value::boolean(true);
      } else if (name == "false" || name == "False") {
        e->value = Value::boolean(false);
      } else if (name == "none" || name == "None") {
        e->value = Value::none();
      } else {
        e->kind = Expr::Kind::kName;
        e->name = name;
      }
      return e;
    }
    if (t.type == Tok::kString) {
      std::string s = next().text;
      while (peek().type == Tok::kString) s += next().text;  // adjacent literals concatenate
      auto e = make(Expr::Kind::kLiteral, line);
      e->value = Value::string(std::move(s));
      return e;
    }
    if (t.type == Tok::kInt || t.type == Tok::kFloat) {
      const Token& n = next();
      auto e = make(Expr::Kind::kLiteral, line);
      e->value = n.type == Tok::kInt ? Value::integer(n.i) : Value::number(n.f);
      return e;
    }
    if (is_op("(")) {
      next();
      if (is_op(")")) {
        next();
        return make(Expr::Kind::kTuple, line);
      }
      ExprPtr first = parse_expression();
      if (!is_op(",")) {
        expect_op(")");
        return first;
      }
      auto tuple = make(Expr::Kind::kTuple, line);
      tuple->items.push_back(std::move(first));
      while (is_op(",")) {
        next();
        if (is_op(")")) break;
        tuple->items.push_back(parse_expression());
      }
      expect_op(")");
      return tuple;
    }
    if (is_op("[")) {
      next();
      auto list = make(Expr::Kind::kList, line);
      while (!is_op("]")) {
        list->items.push_back(parse_expression());
        if (!is_op("]")) expect_op(",");
      }
      next();
      return list;
    }
    if (is_op("{")) {
      next();
      auto dict = make(Expr::Kind::kDict, line);
      while (!is_op("}")) {
        dict->items.push_back(parse_expression());
        expect_op(":");
        dict->items.push_back(parse_expression());
        if (!is_op("}")) expect_op(",");
      }
      next();
      return dict;
    }
    fail(line, "expected an expression, found " + describe(t));
  }

  void parse_call_args(Expr& call) {
    expect_op("(");
    while (!is_op(")")) {
      if (peek().type == Tok::kName && is_op("=", 1)) {
        std::string key = next().text;
        next();
        call.kwargs.emplace_back(std::move(key), parse_expression());
      } else {
        if (!call.kwargs.empty()) fail(peek().line, "a positional argument after a keyword argument");
        call.items.push_back(parse_expression());
      }
      if (!is_op(")")) expect_op(",");
    }
    next();
  }

  ExprPtr parse_postfix(ExprPtr e) {
    for (;;) {
      const int line = peek().line;
      if (is_op(".")) {
        next();
        auto g = make(Expr::Kind::kGetAttr, line);
        if (peek().type == Tok::kInt) {  // foo.0 is foo[0]
          g->kind = Expr::Kind::kGetItem;
          g->items.push_back(std::move(e));
          auto idx = make(Expr::Kind::kLiteral, line);
          idx->value = Value::integer(next().i);
          g->items.push_back(std::move(idx));
        } else {
          g->name = expect_name();
          g->items.push_back(std::move(e));
        }
        e = std::move(g);
      } else if (is_op("[")) {
        next();
        ExprPtr parts[3];
        int colons = 0;
        for (;;) {
          if (is_op("]")) break;
          if (is_op(":")) {
            if (++colons > 2) fail(peek().line, "a slice takes at most two ':'");
            next();
            continue;
          }
          if (parts[colons]) fail(peek().line, "expected ':' or ']' in a subscript, found " + describe(peek()));
          parts[colons] = parse_expression();
        }
        next();
        if (colons == 0) {
          if (!parts[0]) fail(line, "empty subscript []");
          auto g = make(Expr::Kind::kGetItem, line);
          g->items.push_back(std::move(e));
          g->items.push_back(std::move(parts[0]));
          e = std::move(g);
        } else {
          auto s = make(Expr::Kind::kSlice, line);
          s->items.push_back(std::move(e));
          for (auto& part : parts) s->items.push_back(std::move(part));
          e = std::move(s);
        }
      } else if (is_op("(")) {
        auto call = make(Expr::Kind::kCall, line);
        if (e->kind == Expr::Kind::kName) {
          called_.emplace_back(e->name, line);
        } else if (e->kind == Expr::Kind::kGetAttr && !known_methods().contains(e->name)) {
          fail(line, "the method ." + e->name + "() is not supported by mc's Jinja engine");
        }
        call->items.push_back(std::move(e));
        parse_call_args(*call);
        e = std::move(call);
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_filters_and_tests(ExprPtr e) {
    for (;;) {
      if (is_op("|")) {
        const int line = next().line;
        auto f = make(Expr::Kind::kFilter, line);
        f->name = expect_name();
        if (!known_filters().contains(f->name)) {
          fail(line, "the filter '" + f->name + "' is not supported by mc's Jinja engine");
        }
        f->items.push_back(std::move(e));
        if (is_op("(")) parse_call_args(*f);
        e = parse_postfix(std::move(f));
      } else if (is_name("is")) {
        const int line = next().line;
        auto t = make(Expr::Kind::kTest, line);
        if (is_name("not")) {
          next();
          t->negate = true;
        }
        if (peek().type == Tok::kName) {
          t->name = next().text;
        } else if (is_op("==")) {
          t->name = next().text;
        } else {
          fail(peek().line, "expected a test name after 'is', found " + describe(peek()));
        }
        if (!known_tests().contains(t->name)) {
          fail(line, "the test 'is " + t->name + "' is not supported by mc's Jinja engine");
        }
        t->items.push_back(std::move(e));
        if (is_op("(")) {
          parse_call_args(*t);
        } else if (starts_test_argument()) {
          ExprPtr arg = parse_primary();
          t->items.push_back(parse_postfix(std::move(arg)));
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }
  // jinja2 takes one argument without parentheses after a test name when an expression starts there.
  bool starts_test_argument() const {
    const Token& t = peek();
    if (t.type == Tok::kString || t.type == Tok::kInt || t.type == Tok::kFloat) return true;
    if (t.type == Tok::kOp) return t.text == "[" || t.text == "{";
    if (t.type == Tok::kName) {
      static const std::set<std::string, std::less<>> kStop{"else", "or", "and", "if", "is", "in", "not", "recursive"};
      return !kStop.contains(t.text);
    }
    return false;
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::set<std::string, std::less<>> macros_;
  std::vector<std::pair<std::string, int>> called_;
};

// jinja2 reads the source with every \r\n and \r as \n and, keep_trailing_newline being off, drops one trailing
// newline.
std::string normalize_source(const std::string& source) {
  std::string out;
  out.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      out += '\n';
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      out += source[k];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace jinja_parse
}  // namespace detail

Result<Template> Template::parse(const std::string& source, const std::string& name, Limits limits) {
  using detail::jinja_parse::ParseError;
  auto program = std::make_shared<detail::Program>();
  program->name = name;
  program->limits = limits;
  try {
    const std::string src = detail::jinja_parse::normalize_source(source);
    detail::jinja_parse::Lexer lexer(src);
    detail::jinja_parse::Parser parser(lexer.run());
    program->body = parser.parse_template();
  } catch (const ParseError& e) {
    return error(Code::kInvalidArgument, name + " line " + std::to_string(e.line) + ": " + e.message +
                                             " (fix the template, or give the model a template this engine reads)");
  }
  return Template(std::move(program));
}

Result<std::string> Template::render(const nlohmann::json& variables) const {
  detail::Dict globals;
  if (variables.is_object()) {
    for (auto it = variables.begin(); it != variables.end(); ++it) {
      globals.emplace_back(it.key(), detail::from_json(it.value()));
    }
  }
  return detail::render_program(*program_, std::move(globals));
}

Result<std::string> Template::render(const nlohmann::ordered_json& variables) const {
  detail::Dict globals;
  if (variables.is_object()) {
    for (auto it = variables.begin(); it != variables.end(); ++it) {
      globals.emplace_back(it.key(), detail::from_json(it.value()));
    }
  }
  return detail::render_program(*program_, std::move(globals));
}

const std::string& Template::name() const { return program_->name; }

}  // namespace mc::text::jinja
