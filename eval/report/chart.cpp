#include "mc/report/chart.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace mc::report {

namespace {

// Colours that stay apart for colour-blind readers (Okabe-Ito, then darker fill-ins).
constexpr std::array<const char*, 10> kPalette = {"#0072b2", "#e69f00", "#009e73", "#d55e00", "#cc79a7",
                                                  "#56b4e9", "#f0e442", "#000000", "#8c564b", "#7f7f7f"};
constexpr size_t kMaxText = 120;
constexpr size_t kMaxStderr = 4096;

std::string num(double v) {
  std::array<char, 32> buf{};
  auto [end, ec] = std::to_chars(buf.data(), buf.data() + buf.size(), v, std::chars_format::general, 10);
  if (ec != std::errc()) return "0";
  return {buf.data(), end};
}

bool valid_id(const std::string& id) {
  if (id.empty() || id.size() > 64) return false;
  for (char c : id) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-')) return false;
  }
  return true;
}

bool valid_key(const std::string& key) {
  for (char c : key) {
    if (!((c >= 'a' && c <= 'z') || c == ' ')) return false;
  }
  return true;
}

// A gnuplot string of chart text: single-quoted (nothing is interpreted), or double-quoted with "\n" between lines
// when the text has line breaks (chart_text leaves no quote or backslash that could end or escape it).
std::string gp_string(std::string_view text) {
  if (text.find('\n') == std::string_view::npos) return "'" + chart_text(text) + "'";
  std::string out = "\"";
  size_t line = 0;
  for (size_t start = 0; start <= text.size() && line < 4; ++line) {
    const size_t end = std::min(text.find('\n', start), text.size());
    out += (line ? "\\n" : "") + chart_text(text.substr(start, end - start));
    start = end + 1;
  }
  return out + "\"";
}

Status check_chart(const Chart& c) {
  const std::string what = "chart '" + c.id + "'";
  if (!valid_id(c.id)) return error(Code::kInvalidArgument, what + ": the id must be 1-64 of [a-z0-9_-]");
  if (!valid_key(c.key)) return error(Code::kInvalidArgument, what + ": bad key position '" + c.key + "'");
  if (c.series.empty()) return error(Code::kInvalidArgument, what + " has no series");
  for (const Series& s : c.series) {
    if (s.points.empty()) {
      return error(Code::kInvalidArgument, what + ": series '" + s.title + "' has no point");
    }
    if (!s.color.empty() && (s.color.size() != 7 || s.color[0] != '#' ||
                             s.color.find_first_not_of("0123456789abcdefABCDEF", 1) != std::string::npos)) {
      return error(Code::kInvalidArgument, what + ": series '" + s.title + "': colour must be #rrggbb");
    }
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) {
        return error(Code::kInvalidArgument, what + ": series '" + s.title + "' has a value that is not finite");
      }
      if ((c.log_x && x <= 0) || (c.log_y && y <= 0)) {
        return error(Code::kInvalidArgument,
                     what + ": series '" + s.title + "' has a value <= 0 on a logarithmic axis");
      }
      if (s.style == SeriesStyle::kBars &&
          (x < 0 || x >= static_cast<double>(c.categories.size()) || x != std::floor(x))) {
        return error(Code::kInvalidArgument, what + ": series '" + s.title + "': a bar's x must be a category index");
      }
    }
  }
  return Status::ok();
}

void write_chart(std::ostringstream& g, const Chart& c, size_t index) {
  g << "\n# ---- " << c.id << "\nreset\n";
  g << "set output '" << c.id << ".svg'\n";
  g << "set title " << gp_string(c.title) << " font ',15'\n";
  g << "set xlabel " << gp_string(c.x_label) << "\nset ylabel " << gp_string(c.y_label) << "\n";
  g << "set border 3 lw 1.2\nset tics nomirror out\nset grid lc rgb '#d9d9d9' lw 0.8\n";
  g << "set key " << c.key << " box lc rgb '#bbbbbb' opaque samplen 2 spacing 1.1\n";
  if (c.log_x) g << "set logscale x 10\nset format x '%.0s%c'\n";
  if (c.log_y) g << "set logscale y 10\n";
  if (!c.log_y && (c.y_from_zero || c.y_max)) {
    g << "set yrange [" << (c.y_from_zero ? "0" : "*") << ":" << (c.y_max ? num(*c.y_max) : "*") << "]\n";
  }
  size_t bar_series = 0;
  for (const Series& s : c.series) bar_series += s.style == SeriesStyle::kBars ? 1 : 0;
  const double bar_w = bar_series > 0 ? 0.8 / static_cast<double>(bar_series) : 0;
  if (!c.categories.empty()) {
    g << "set xtics (";
    for (size_t i = 0; i < c.categories.size(); ++i) g << (i ? ", " : "") << gp_string(c.categories[i]) << " " << i;
    g << ")\n";
    bool two_lines = false;
    for (const std::string& cat : c.categories) two_lines |= cat.find('\n') != std::string::npos;
    if (two_lines) g << "set bmargin 5\n";
    if (c.categories.size() > 6) g << "set xtics rotate by 45 right\n";  // many labels: slanted, so none overlap
    g << "set xrange [-0.6:" << num(static_cast<double>(c.categories.size()) - 0.4) << "]\n";
    g << "set grid noxtics\nset boxwidth " << num(bar_w * 0.92) << " absolute\nset style fill solid 0.85 border "
      << "lc rgb '#333333'\n";
  }
  // The data, one datablock per series ($c<chart>s<series>).
  size_t bar_index = 0;
  for (size_t i = 0; i < c.series.size(); ++i) {
    const Series& s = c.series[i];
    g << "$c" << index << "s" << i << " << EOD\n";
    double offset = 0;
    if (s.style == SeriesStyle::kBars) {
      offset = (static_cast<double>(bar_index) - static_cast<double>(bar_series - 1) / 2.0) * bar_w;
      ++bar_index;
    }
    for (const auto& [x, y] : s.points) g << num(x + offset) << " " << num(y) << "\n";
    g << "EOD\n";
  }
  g << "plot ";
  for (size_t i = 0; i < c.series.size(); ++i) {
    const Series& s = c.series[i];
    const std::string color = s.color.empty() ? kPalette[i % kPalette.size()] : s.color;
    g << (i ? ", \\\n     " : "") << "$c" << index << "s" << i << " using 1:2 ";
    switch (s.style) {
      case SeriesStyle::kLinesPoints:
        g << "with linespoints lw 1.6 pt " << s.point_type << " ps " << num(s.point_size);
        break;
      case SeriesStyle::kPoints:
        g << "with points pt " << s.point_type << " ps " << num(s.point_size);
        break;
      case SeriesStyle::kBars:
        g << "with boxes";
        break;
    }
    g << " lc rgb '" << color << "' title " << gp_string(s.title);
  }
  g << "\nunset output\n";
}

// The first executable `name` in $PATH.
std::string search_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  std::istringstream in(dirs);
  for (std::string dir; std::getline(in, dir, ':');) {
    if (dir.empty()) continue;
    std::string candidate = dir + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// Removes a temporary directory and what is in it when it goes out of scope.
struct TempDir {
  std::string path;
  ~TempDir() {
    if (path.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return error(Code::kIo, "cannot read " + path + ": " + std::strerror(errno));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs `argv` in `dir` with stdin and stdout on /dev/null; returns its stderr (at most kMaxStderr bytes) and exit
// status, or kTimeout after killing it when it runs past `timeout_ms`.
struct ChildResult {
  int status = 0;
  std::string err;
};
Result<ChildResult> run_child(const std::vector<std::string>& argv, const std::string& dir, int64_t timeout_ms) {
  std::array<int, 2> fds{-1, -1};
  if (::pipe2(fds.data(), O_CLOEXEC) != 0) return error(Code::kIo, std::string("pipe: ") + std::strerror(errno));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDERR_FILENO);
  posix_spawn_file_actions_addchdir_np(&fa, dir.c_str());
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // A small, fixed environment: the C locale (decimal points), no init file, no display.
  std::string home = "HOME=" + dir;
  std::array<char*, 4> env = {const_cast<char*>("LC_ALL=C"), const_cast<char*>("PATH=/usr/bin:/bin"), home.data(),
                              nullptr};
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, argv[0].c_str(), &fa, nullptr, args.data(), env.data());
  posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    return error(Code::kIo, "cannot start " + argv[0] + ": " + std::strerror(rc));
  }
  ChildResult out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  bool timed_out = false;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    std::array<char, 1024> buf{};
    const ssize_t got = ::read(fds[0], buf.data(), buf.size());
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;  // EOF: the child closed its stderr (it is exiting)
    if (out.err.size() < kMaxStderr) {
      out.err.append(buf.data(), std::min(static_cast<size_t>(got), kMaxStderr - out.err.size()));
    }
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  while (::waitpid(pid, &out.status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    return error(Code::kTimeout, argv[0] + " ran past its deadline of " + std::to_string(timeout_ms) +
                                     " ms and was killed (a very large chart? fewer points, or a faster machine)");
  }
  return out;
}

}  // namespace

int64_t Chart::points() const {
  int64_t n = 0;
  for (const Series& s : series) n += static_cast<int64_t>(s.points.size());
  return n;
}

bool drop_zero_bars(Chart& chart) {
  bool dropped = false;
  for (Series& s : chart.series) {
    if (s.style != SeriesStyle::kBars) continue;
    const size_t before = s.points.size();
    std::erase_if(s.points, [](const std::pair<double, double>& p) { return p.second == 0; });
    dropped |= s.points.size() != before;
  }
  std::erase_if(chart.series, [](const Series& s) { return s.points.empty(); });
  if (dropped) chart.caption += " A missing bar is 0.";
  return dropped;
}

std::string chart_text(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size() && out.size() < kMaxText; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
        std::string_view(" .,:;()[]+-_/%*~!?").find(static_cast<char>(c)) != std::string_view::npos) {
      out.push_back(static_cast<char>(c));
      continue;
    }
    // The UTF-8 signs our own labels use: ≤ ≥ (E2 89 A4/A5), µ (C2 B5), × (C3 97).
    bool kept = false;
    for (std::string_view sign : {"\xe2\x89\xa4", "\xe2\x89\xa5", "\xc2\xb5", "\xc3\x97"}) {
      if (text.substr(i, sign.size()) == sign) {
        out.append(sign);
        i += sign.size() - 1;
        kept = true;
        break;
      }
    }
    if (!kept) out.push_back('_');
  }
  return out;
}

Result<std::string> gnuplot_script(const std::vector<Chart>& charts, int width_px, int height_px) {
  if (width_px < 100 || width_px > 4000 || height_px < 100 || height_px > 4000) {
    return error(Code::kInvalidArgument, "chart size " + std::to_string(width_px) + "x" + std::to_string(height_px) +
                                             " px: give 100 to 4000 px each way");
  }
  std::ostringstream g;
  g << "# written by mc's report library (mc/report/chart.hpp); data inline\n";
  g << "set terminal svg size " << width_px << "," << height_px
    << " dynamic noenhanced font 'Liberation Sans,13' background '#ffffff'\n";
  g << "set encoding utf8\n";
  for (size_t i = 0; i < charts.size(); ++i) {
    MC_RETURN_IF_ERROR(check_chart(charts[i]));
    for (size_t j = 0; j < i; ++j) {
      if (charts[j].id == charts[i].id) return error(Code::kInvalidArgument, "two charts named '" + charts[i].id + "'");
    }
    write_chart(g, charts[i], i);
  }
  return g.str();
}

Result<std::string> find_gnuplot(const std::string& configured) {
  std::string name = configured;
  if (name.empty()) {
    const char* env = std::getenv("MC_GNUPLOT");
    if (env != nullptr && *env != '\0') name = env;
  }
  const std::string remedy =
      "install it with `apt-get install gnuplot-nox` (tools/install-deps.sh does), or set "
      "MC_GNUPLOT to its path";
  if (name.empty()) {
    std::string found = search_path("gnuplot");
    if (found.empty()) {
      return error(Code::kNotFound, "the charts need gnuplot, and there is none in PATH: " + remedy);
    }
    return found;
  }
  if (name.find('/') == std::string::npos) {
    std::string found = search_path(name);
    if (found.empty()) return error(Code::kNotFound, "gnuplot '" + name + "' (MC_GNUPLOT) is not in PATH: " + remedy);
    return found;
  }
  if (::access(name.c_str(), X_OK) != 0) {
    return error(Code::kNotFound,
                 "gnuplot '" + name + "' (MC_GNUPLOT) cannot be run: " + std::strerror(errno) + "; " + remedy);
  }
  return name;
}

Result<std::vector<std::string>> render_svg(const std::vector<Chart>& charts, const RenderOptions& options) {
  if (charts.empty()) return std::vector<std::string>{};
  MC_ASSIGN_OR_RETURN(std::string script, gnuplot_script(charts, options.width_px, options.height_px));
  MC_ASSIGN_OR_RETURN(std::string gnuplot, find_gnuplot(options.gnuplot));
  std::error_code ec;
  std::filesystem::path base = std::filesystem::temp_directory_path(ec);
  if (ec) base = "/tmp";
  std::string pattern = (base / "mc-charts.XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) {
    return error(Code::kIo, "cannot make a temporary directory " + pattern + " for gnuplot: " + std::strerror(errno) +
                                " (set TMPDIR to a writable directory)");
  }
  TempDir dir{pattern};
  {
    std::ofstream f(dir.path + "/charts.gp");
    f << script;
    if (!f.flush()) {
      return error(Code::kIo, "cannot write the gnuplot script in " + dir.path + ": " + std::strerror(errno));
    }
  }
  MC_ASSIGN_OR_RETURN(ChildResult child, run_child({gnuplot, "-d", "charts.gp"}, dir.path, options.timeout_ms));
  if (!WIFEXITED(child.status) || WEXITSTATUS(child.status) != 0) {
    const std::string how = WIFEXITED(child.status) ? "exited with status " + std::to_string(WEXITSTATUS(child.status))
                                                    : "was killed by signal " + std::to_string(WTERMSIG(child.status));
    return error(Code::kInternal, gnuplot + " " + how + " drawing the charts: " +
                                      (child.err.empty() ? std::string("(no message)") : child.err));
  }
  std::vector<std::string> svgs;
  svgs.reserve(charts.size());
  for (const Chart& c : charts) {
    auto svg = read_file(dir.path + "/" + c.id + ".svg");
    if (!svg.is_ok()) {
      return error(Code::kInternal, "gnuplot drew no " + c.id + ".svg: " + svg.status().message() +
                                        "; it said: " + (child.err.empty() ? std::string("(nothing)") : child.err));
    }
    svgs.push_back(std::move(svg).value());
  }
  return svgs;
}

}  // namespace mc::report
