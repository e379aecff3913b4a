#include "mc/report/format.hpp"

#include <algorithm>
#include <iomanip>
#include <sstream>

namespace mc::replay::format {

std::string fixed(double v, int digits) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(digits) << v;
  return os.str();
}

std::string pct(double fraction) { return fixed(100.0 * fraction, 1); }

void print_rows(std::ostream& out, const std::vector<std::vector<std::string>>& rows) {
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

void print_header(std::ostream& out, const RunInfo& info) {
  std::string header;
  for (const auto& [k, v] : info) header += (header.empty() ? "" : "  ") + k + "=" + v;
  if (!header.empty()) out << header << "\n\n";
}

nlohmann::json distribution_json(const std::optional<Distribution>& d) {
  if (!d) return nlohmann::json::object({{"count", 0}});
  return {{"count", d->count}, {"mean", d->mean}, {"p50", d->p50}, {"p90", d->p90}, {"p99", d->p99}, {"max", d->max}};
}

nlohmann::json info_json(const RunInfo& info) {
  nlohmann::json cfg = nlohmann::json::object();
  for (const auto& [k, v] : info) cfg[k] = v;
  return cfg;
}

}  // namespace mc::replay::format
