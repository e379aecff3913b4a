#include "mc/common/report.hpp"

#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <iomanip>
#include <sstream>

#include "mc/common/build_id.hpp"

namespace mc::report {

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

std::string fixed(double v, int digits) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(digits) << v;
  return os.str();
}

std::string pct(double fraction) { return fixed(100.0 * fraction, 1); }

void print_table(std::ostream& out, const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& row : rows)
    for (size_t i = 0; i < row.size(); ++i) {
      if (width.size() <= i) width.push_back(0);
      width[i] = std::max(width[i], row[i].size());
    }
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      std::string pad(width[i] - row[i].size(), ' ');
      line += i == 0 ? row[i] + pad : "  " + pad + row[i];
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << "\n";
  }
}

RunInfo run_info(const std::string& tool) { return {{"tool", tool}, {"build", build_id()}}; }

RunInfo host_run_info(const std::string& tool) {
  RunInfo info = run_info(tool);
  std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char when[32] = {};
  std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &utc);
  info.emplace_back("host", host_name());
  info.emplace_back("time", when);
  return info;
}

void print_run_header(std::ostream& out, const RunInfo& info) {
  std::string header;
  for (const auto& [k, v] : info) header += (header.empty() ? "" : "  ") + k + "=" + v;
  if (!header.empty()) out << header << "\n\n";
}

nlohmann::json run_info_json(const RunInfo& info) {
  nlohmann::json cfg = nlohmann::json::object();
  for (const auto& [k, v] : info) cfg[k] = v;
  return cfg;
}

nlohmann::json error_json(const Status& status) {
  return {{"error", {{"code", std::string(code_name(status.code()))}, {"message", status.message()}}}};
}

Status print_error(bool json, std::ostream& out, const Status& status) {
  if (json && !status.is_ok())
    out << error_json(status).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  return status;
}

}  // namespace mc::report
