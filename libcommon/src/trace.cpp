#include "mc/common/trace.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>

#include <nlohmann/json.hpp>
#include "mc/common/input_file.hpp"

namespace mc::trace {
namespace {

using json = nlohmann::json;

Status bad(const std::string& where, const std::string& why) {
  return Status(Code::kInvalidArgument, where + ": " + why);
}

// An integer field within [lo, hi]; floats (512.5, 1e3), strings, and values outside the range fail.
Result<int64_t> int_field(const json& obj, const char* key, int64_t lo, int64_t hi, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) return bad(where, std::string("missing field \"") + key + "\"");
  if (it->is_number_unsigned()) {
    uint64_t v = it->get<uint64_t>();
    if (v > static_cast<uint64_t>(hi))
      return bad(where,
                 std::string("\"") + key + "\" = " + std::to_string(v) + " is larger than " + std::to_string(hi));
    if (static_cast<int64_t>(v) < lo)
      return bad(where, std::string("\"") + key + "\" = " + std::to_string(v) + " is below " + std::to_string(lo));
    return static_cast<int64_t>(v);
  }
  if (it->is_number_integer()) {
    int64_t v = it->get<int64_t>();
    if (v < lo || v > hi)
      return bad(where, std::string("\"") + key + "\" = " + std::to_string(v) + " is outside [" + std::to_string(lo) +
                            ", " + std::to_string(hi) + "]");
    return v;
  }
  return bad(where, std::string("\"") + key + "\" must be an integer, got " + it->dump());
}

// An optional string field ("" when absent).
Result<std::string> optional_string_field(const json& obj, const char* key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) return std::string();
  if (!it->is_string()) return bad(where, std::string("\"") + key + "\" must be a string, got " + it->dump());
  return it->get<std::string>();
}

}  // namespace

Result<Request> parse_row(const std::string& line, int64_t block_size, const std::string& where) {
  json obj;
  try {
    obj = json::parse(line);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number too large ("1e999")
    return bad(where, std::string("not valid JSON (") + e.what() + ")");
  }
  if (!obj.is_object()) return bad(where, "expected a JSON object, got " + std::string(obj.type_name()));
  Request r;
  // Arrival times up to ~292 years in ms; lengths up to 2^31-1 tokens (a larger prompt is not a prompt).
  constexpr int64_t kMaxTokens = std::numeric_limits<int32_t>::max();
  MC_ASSIGN_OR_RETURN(r.timestamp_ms, int_field(obj, "timestamp", 0, std::numeric_limits<int64_t>::max(), where));
  MC_ASSIGN_OR_RETURN(r.input_length, int_field(obj, "input_length", 1, kMaxTokens, where));
  MC_ASSIGN_OR_RETURN(r.output_length, int_field(obj, "output_length", 0, kMaxTokens, where));
  auto ids = obj.find("hash_ids");
  if (ids == obj.end()) return bad(where, "missing field \"hash_ids\"");
  if (!ids->is_array()) return bad(where, "\"hash_ids\" must be an array, got " + std::string(ids->type_name()));
  r.hash_ids.reserve(ids->size());
  for (size_t i = 0; i < ids->size(); ++i) {
    const json& id = (*ids)[i];
    if (id.is_number_unsigned()) {
      r.hash_ids.push_back(id.get<uint64_t>());
    } else if (id.is_number_integer() && id.get<int64_t>() >= 0) {
      r.hash_ids.push_back(static_cast<uint64_t>(id.get<int64_t>()));
    } else {
      return bad(where, "hash_ids[" + std::to_string(i) + "] = " + id.dump() +
                            " is not an integer in [0, 18446744073709551615]");
    }
  }
  MC_ASSIGN_OR_RETURN(r.scope.lora_name, optional_string_field(obj, "lora_name", where));
  MC_ASSIGN_OR_RETURN(r.scope.lora_version, optional_string_field(obj, "lora_version", where));
  MC_ASSIGN_OR_RETURN(r.scope.salt, optional_string_field(obj, "salt", where));
  MC_RETURN_IF_ERROR(validate_key_scope(r.scope, where));
  const int64_t expected = (r.input_length + block_size - 1) / block_size;
  if (static_cast<int64_t>(r.hash_ids.size()) != expected) {
    return bad(where, "input_length " + std::to_string(r.input_length) + " needs ceil(" +
                          std::to_string(r.input_length) + "/" + std::to_string(block_size) + ") = " +
                          std::to_string(expected) + " hash_ids, the row has " + std::to_string(r.hash_ids.size()));
  }
  return r;
}

Reader::Reader(std::istream& in, ReaderOptions options) : in_(&in), options_(std::move(options)) {}
Reader::~Reader() = default;

Result<std::unique_ptr<Reader>> Reader::open(const std::string& path, ReaderOptions options) {
  if (path == "-") {
    if (options.source_name == "-") options.source_name = "<stdin>";
    return std::make_unique<Reader>(std::cin, std::move(options));
  }
  MC_ASSIGN_OR_RETURN(std::ifstream in,
                      open_input_file(path, "trace file", "give a path to a Mooncake JSONL trace, or - for stdin"));
  auto file = std::make_unique<std::ifstream>(std::move(in));
  if (options.source_name == "-") options.source_name = path;
  auto reader = std::make_unique<Reader>(*file, std::move(options));
  reader->owned_ = std::move(file);
  reader->in_ = reader->owned_.get();
  return reader;
}

Result<std::optional<Request>> Reader::next() {
  if (options_.block_size <= 0) return Status(Code::kInvalidArgument, "trace block size must be positive");
  std::string line;
  for (LineRead got; (got = read_line_bounded(*in_, line)) != LineRead::kEnd;) {
    const int64_t line_no = ++stats_.lines;
    if (line_no == 1 && line.size() >= 3 && static_cast<unsigned char>(line[0]) == 0xEF &&
        static_cast<unsigned char>(line[1]) == 0xBB && static_cast<unsigned char>(line[2]) == 0xBF) {
      line.erase(0, 3);
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (got == LineRead::kLine && line.find_first_not_of(" \t") == std::string::npos) {
      ++stats_.blank;
      continue;
    }
    const std::string where = options_.source_name + ":" + std::to_string(line_no);
    Result<Request> row =
        got == LineRead::kTooLong
            ? Result<Request>(bad(where, "a line longer than " + std::to_string(kMaxInputLineBytes >> 20) +
                                             " MiB (no newline?): not a trace row"))
            : parse_row(line, options_.block_size, where);
    if (row.is_ok() && row.value().timestamp_ms < last_timestamp_ms_) {
      row = bad(where, "timestamp " + std::to_string(row.value().timestamp_ms) + " ms goes back from " +
                           std::to_string(last_timestamp_ms_) + " ms (rows must be in arrival order)");
    }
    if (!row.is_ok()) {
      if (options_.mode == Mode::kStrict) return row.status();
      if (got == LineRead::kTooLong) in_->ignore(std::numeric_limits<std::streamsize>::max(), '\n');
      ++stats_.skipped;
      if (stats_.first_errors.size() < 10) stats_.first_errors.push_back(row.status().message());
      if (options_.warn_on_stderr) std::cerr << "warning: skipping row: " << row.status().message() << '\n';
      continue;
    }
    row.value().line_no = line_no;
    last_timestamp_ms_ = row.value().timestamp_ms;
    ++stats_.rows;
    return std::optional<Request>(std::move(row).value());
  }
  if (in_->bad()) {
    return Status(Code::kIo, "reading " + options_.source_name + " after line " + std::to_string(stats_.lines) + ": " +
                                 std::strerror(errno));
  }
  return std::optional<Request>();
}

}  // namespace mc::trace
