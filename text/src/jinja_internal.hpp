// Internals of mc::text::jinja shared by the parser (jinja.cpp) and the evaluator (jinja_eval.cpp): the value
// type and the syntax tree. Not installed; see mc/text/jinja.hpp for the contract.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mc/text/jinja.hpp"

namespace mc::text::jinja::detail {

struct Value;
using List = std::vector<Value>;
// A dict keeps insertion order (Python's); lookups are linear, which is fine for the small objects of a chat.
using Dict = std::vector<std::pair<std::string, Value>>;

struct Macro;

// A template value. Lists and dicts are shared and immutable once built, except a namespace's dict, which
// `set ns.attr` changes in place (jinja2's Namespace is the one mutable object of a sandboxed template).
struct Value {
  enum class Kind : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kMacro };
  Kind kind = Kind::kUndefined;
  bool tuple = false;  // a list that Python would hold as a tuple (printed with parentheses)
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                       // kString; for kUndefined the name that was looked up (for messages)
  std::shared_ptr<const List> list;    // kList
  std::shared_ptr<Dict> dict;          // kDict, kNamespace
  std::shared_ptr<const Macro> macro;  // kMacro

  static Value undefined(std::string name = {}) {
    Value v;
    v.s = std::move(name);
    return v;
  }
  static Value none() {
    Value v;
    v.kind = Kind::kNone;
    return v;
  }
  static Value boolean(bool x) {
    Value v;
    v.kind = Kind::kBool;
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v;
    v.kind = Kind::kInt;
    v.i = x;
    return v;
  }
  static Value number(double x) {
    Value v;
    v.kind = Kind::kFloat;
    v.f = x;
    return v;
  }
  static Value string(std::string x) {
    Value v;
    v.kind = Kind::kString;
    v.s = std::move(x);
    return v;
  }
  static Value of_list(List x, bool tuple = false) {
    Value v;
    v.kind = Kind::kList;
    v.tuple = tuple;
    v.list = std::make_shared<const List>(std::move(x));
    return v;
  }
  static Value of_dict(Dict x) {
    Value v;
    v.kind = Kind::kDict;
    v.dict = std::make_shared<Dict>(std::move(x));
    return v;
  }

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool; }
  bool is_mapping() const { return kind == Kind::kDict || kind == Kind::kNamespace; }
};

// ---- syntax tree ----

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind : uint8_t {
    kLiteral,  // value
    kName,     // name
    kList,     // items
    kTuple,    // items
    kDict,     // items: key, value, key, value...
    kGetAttr,  // items[0].name
    kGetItem,  // items[0][items[1]]
    kSlice,    // items[0][items[1]:items[2]:items[3]] (null = absent)
    kCall,     // items[0](items[1..], kwargs)
    kFilter,   // items[0] | name(items[1..], kwargs)
    kTest,     // items[0] is [not] name(items[1..])   (negate)
    kUnary,    // op items[0]: "not", "-", "+"
    kBinary,   // items[0] op items[1]
    kCompare,  // items[0] op items[1] (==, !=, <, <=, >, >=, in, not in)
    kAnd,
    kOr,
    kCond,  // items[0] if items[1] else items[2] (items[2] may be null)
  };
  Kind kind = Kind::kLiteral;
  int line = 0;
  Value value;
  std::string name;  // name, attribute, filter, test or operator
  bool negate = false;
  std::vector<ExprPtr> items;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind : uint8_t {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // branches: (cond, body)...; else_body
    kFor,       // targets in expr [if cond]: body; else_body
    kSet,       // targets (or ns.attr) = expr
    kSetBlock,  // {% set name %}body{% endset %}
    kMacro,     // macro definition
    kBreak,
    kContinue,
    kBlock,  // a body rendered in place (generation)
  };
  Kind kind = Kind::kText;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr cond;
  std::vector<std::string> targets;
  std::string attr;  // kSet on ns.attr: targets[0] is the namespace, attr the attribute
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  std::shared_ptr<const Macro> macro;
};

struct Macro {
  std::string name;
  int line = 0;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // aligned with params; null = required
  Body body;
};

struct Program {
  std::string name;
  Limits limits;
  Body body;
};

// Renders `program` with `globals` (the caller's variables). Defined in jinja_eval.cpp.
Result<std::string> render_program(const Program& program, Dict globals);

// Converts a JSON value (nlohmann::json or ordered_json) into a template value.
template <typename Json>
Value from_json(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null:
      return Value::none();
    case Json::value_t::boolean:
      return Value::boolean(j.template get<bool>());
    case Json::value_t::number_integer:
      return Value::integer(j.template get<int64_t>());
    case Json::value_t::number_unsigned: {
      const auto u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::number(static_cast<double>(u));
      return Value::integer(static_cast<int64_t>(u));
    }
    case Json::value_t::number_float:
      return Value::number(j.template get<double>());
    case Json::value_t::string:
      return Value::string(j.template get<std::string>());
    case Json::value_t::array: {
      List out;
      out.reserve(j.size());
      for (const auto& e : j) out.push_back(from_json(e));
      return Value::of_list(std::move(out));
    }
    case Json::value_t::object: {
      Dict out;
      out.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) out.emplace_back(it.key(), from_json(it.value()));
      return Value::of_dict(std::move(out));
    }
    default:
      return Value::none();  // binary and discarded values do not come from a parsed request
  }
}

}  // namespace mc::text::jinja::detail
