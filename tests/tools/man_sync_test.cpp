// Every tool in build/bin has a man page whose OPTIONS and ENVIRONMENT match the tool's --help both ways,
// per (sub)command: a flag a command's --help lists must be documented in an OPTIONS entry that covers that
// command, and every flag an OPTIONS entry documents must be in the --help of each command it covers (a stale
// flag fails). An MC_* variable a --help names must be in ENVIRONMENT, and every MC_* variable ENVIRONMENT
// names must be a --help fallback or read with getenv() somewhere in the sources.
//
// Which commands an OPTIONS entry covers (man/*.1 follow this):
//  - the entry's description may start with "(put)" or "(rm, ls, stat)": exactly those subcommands;
//  - else its .SS subsection's title: the subcommand names in it ("put, get, rm, ls, stat",
//    "Engine options (bench, read, write)"); "Common" / "common": the top-level command (--log-level,
//    --version: the options given before a subcommand); the tool's default command word (mc-trace-replay:
//    "replay") or no subcommand name at all: the top-level command;
//  - no .SS (tools without subcommands): the top-level command.
// Runs over whatever tools exist, so a new tool is covered by itself.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

const std::string kTop;  // the command run without a subcommand

std::string run(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

std::set<std::string> long_flags_in(const std::string& text) {
  std::set<std::string> out;
  static const std::regex re("(^|[^a-z0-9-])(--[a-z0-9][a-z0-9-]*)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it)
    out.insert((*it)[2].str());
  return out;
}

std::set<std::string> envs_in(const std::string& text) {
  std::set<std::string> out;
  static const std::regex re("\\b(MC_[A-Z0-9_]*[A-Z0-9])\\b");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it)
    out.insert((*it)[1].str());
  return out;
}

// One command's CLI11 --help: the long flags of its option lines ("  -h,--help  ...", "  --listen TEXT ...",
// not flags named in descriptions), the MC_* variables ("(Env:MC_LOG_LEVEL)") and the subcommands.
struct Help {
  std::set<std::string> flags;
  std::set<std::string> envs;
  std::set<std::string> subcommands;
};

Help parse_help(const std::string& text) {
  Help h;
  static const std::regex option_line("^  (-[^ ]*)( .*)?$");
  static const std::regex sub_line("^  ([a-z][a-z0-9-]*)( .*)?$");
  static const std::regex env("Env:(MC_[A-Z0-9_]+)");
  enum { kNone, kOptions, kSubcommands } section = kNone;
  for (const auto& line : lines_of(text)) {
    if (!line.empty() && line[0] != ' ') {
      section = line.rfind("OPTIONS:", 0) == 0 || line.rfind("Options:", 0) == 0           ? kOptions
                : line.rfind("SUBCOMMANDS:", 0) == 0 || line.rfind("Subcommands:", 0) == 0 ? kSubcommands
                                                                                           : kNone;
      continue;
    }
    std::smatch m;
    if (section == kOptions && std::regex_match(line, m, option_line)) {
      for (const auto& f : long_flags_in(m[1].str())) h.flags.insert(f);
    } else if (section == kSubcommands && std::regex_match(line, m, sub_line)) {
      h.subcommands.insert(m[1].str());
    }
    for (auto it = std::sregex_iterator(line.begin(), line.end(), env); it != std::sregex_iterator(); ++it)
      h.envs.insert((*it)[1].str());
  }
  h.flags.erase("--help");  // CLI11 adds it to every command; the pages document it once, under Common
  return h;
}

// Man page text with the roff escapes for '-' and font changes removed, and quoted .SH names unquoted.
std::string man_text(const fs::path& page) {
  std::string s = read_file(page);
  s = std::regex_replace(s, std::regex("\\\\-"), "-");
  s = std::regex_replace(s, std::regex("\\\\f[BIRP]"), "");
  s = std::regex_replace(s, std::regex("\\\\\\(em"), "--");
  return std::regex_replace(s, std::regex("\\.SH \"([^\"]*)\""), ".SH $1");
}

// The lines of section `name` (.SH name up to the next .SH).
std::vector<std::string> section_lines(const std::string& text, const std::string& name) {
  std::vector<std::string> out;
  bool in = false;
  for (const auto& line : lines_of(text)) {
    if (line.rfind(".SH ", 0) == 0) {
      in = line == ".SH " + name;
      continue;
    }
    if (in) out.push_back(line);
  }
  return out;
}

// One OPTIONS entry: the flags of its .TP term line and the commands it covers.
struct Entry {
  std::set<std::string> flags;
  std::set<std::string> commands;
  std::string where;  // "OPTIONS > serve: .BI --listen ..." for messages
};

std::set<std::string> commands_named(const std::string& text, const std::set<std::string>& subcommands,
                                     const std::string& default_word) {
  std::set<std::string> out;
  static const std::regex word("[A-Za-z][A-Za-z0-9-]*");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), word); it != std::sregex_iterator(); ++it) {
    std::string w = it->str();
    std::string lower;
    for (char c : w) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (subcommands.count(w)) out.insert(w);
    if (lower == "common" || (!default_word.empty() && lower == default_word)) out.insert(kTop);
  }
  return out;
}

std::vector<Entry> options_entries(const std::vector<std::string>& lines, const std::set<std::string>& subcommands,
                                   const std::string& default_word) {
  std::vector<Entry> out;
  std::set<std::string> scope = {kTop};
  std::string title = "(no subsection)";
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].rfind(".SS ", 0) == 0) {
      title = lines[i].substr(4);
      scope = commands_named(title, subcommands, default_word);
      if (scope.empty()) scope = {kTop};
      continue;
    }
    if (lines[i] != ".TP" || i + 1 >= lines.size()) continue;
    // The term line, and further term lines each after a .TQ; then the description.
    Entry e;
    size_t term = i + 1;
    std::string terms = lines[term];
    while (term + 2 < lines.size() && lines[term + 1] == ".TQ") {
      term += 2;
      terms += " " + lines[term];
    }
    e.flags = long_flags_in(terms);
    if (e.flags.empty()) continue;  // a term that is not an option (a value list, a file format)
    e.commands = scope;
    static const std::regex prefix("^\\(([a-z][a-z0-9-]*(, [a-z][a-z0-9-]*)*)\\)");
    std::smatch m;
    if (term + 1 < lines.size() && std::regex_search(lines[term + 1], m, prefix)) {
      std::set<std::string> named = commands_named(m[1].str(), subcommands, default_word);
      if (!named.empty()) e.commands = named;
    }
    e.where = "OPTIONS > " + title + ": " + terms;
    out.push_back(std::move(e));
  }
  return out;
}

std::string name_of(const std::string& tool, const std::string& command) {
  return command.empty() ? tool : tool + " " + command;
}

// MC_* variables that the sources read with getenv() (not through a CLI11 fallback).
std::set<std::string> getenv_variables() {
  std::set<std::string> out;
  static const std::regex re("getenv\\(\"(MC_[A-Z0-9_]+)\"\\)");
  for (const char* dir : {"libcommon", "transfer", "store", "model", "infer", "sched", "eval", "gateway", "tools"}) {
    const fs::path root = fs::path(MC_SOURCE_DIR) / dir;
    if (!fs::exists(root)) continue;
    for (const auto& f : fs::recursive_directory_iterator(root)) {
      const std::string ext = f.path().extension().string();
      if (ext != ".cpp" && ext != ".hpp") continue;
      const std::string text = read_file(f.path());
      for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it)
        out.insert((*it)[1].str());
    }
  }
  return out;
}

TEST(ManSync, EveryToolsPageMatchesItsHelpBothWays) {
  const fs::path bin = fs::path(MC_BINARY_DIR) / "bin";
  const fs::path man = fs::path(MC_SOURCE_DIR) / "man";
  ASSERT_TRUE(fs::exists(bin)) << bin;
  const std::set<std::string> read_by_getenv = getenv_variables();
  int tools = 0;
  for (const auto& entry : fs::directory_iterator(bin)) {
    const std::string tool = entry.path().filename().string();
    if (tool.rfind("mc-", 0) != 0) continue;
    ++tools;
    const fs::path page = man / (tool + ".1");
    ASSERT_TRUE(fs::exists(page)) << tool << " has no man page " << page;
    const std::string text = man_text(page);
    for (const char* section : {".SH NAME", ".SH SYNOPSIS", ".SH DESCRIPTION", ".SH OPTIONS", ".SH ENVIRONMENT",
                                ".SH EXIT STATUS", ".SH EXAMPLES", ".SH SEE ALSO"}) {
      EXPECT_NE(text.find(section), std::string::npos) << page << " lacks section " << section;
    }

    // --help of the top-level command and of each subcommand.
    std::map<std::string, Help> helps;
    helps[kTop] = parse_help(run(entry.path().string() + " --help 2>&1"));
    ASSERT_FALSE(helps[kTop].flags.empty()) << tool << " --help lists no options";
    const std::set<std::string> subcommands = helps[kTop].subcommands;
    for (const auto& sub : subcommands) {
      helps[sub] = parse_help(run(entry.path().string() + " " + sub + " --help 2>&1"));
      EXPECT_NE(text.find(sub), std::string::npos) << page << " does not mention subcommand " << sub;
    }
    // A tool that also runs without a subcommand (mc-trace-replay) names that command by its last word.
    const std::string default_word = tool.substr(tool.rfind('-') + 1);
    const std::vector<Entry> entries = options_entries(section_lines(text, "OPTIONS"), subcommands, default_word);

    // --help -> page: each command's flags are documented for that command.
    for (const auto& [command, help] : helps) {
      for (const auto& flag : help.flags) {
        bool documented = false;
        for (const auto& e : entries) documented = documented || (e.flags.count(flag) && e.commands.count(command));
        EXPECT_TRUE(documented) << page << ": OPTIONS has no entry for " << flag << " covering `"
                                << name_of(tool, command) << "` (it is in that command's --help)";
      }
    }
    // page -> --help: each documented flag exists in every command its entry covers.
    for (const auto& e : entries) {
      for (const auto& flag : e.flags) {
        for (const auto& command : e.commands) {
          if (flag == "--help") continue;
          auto it = helps.find(command);
          ASSERT_NE(it, helps.end()) << page << ": " << e.where << " covers unknown command " << command;
          EXPECT_TRUE(it->second.flags.count(flag))
              << page << ": " << e.where << " documents " << flag << " for `" << name_of(tool, command)
              << "`, whose --help has no such flag (stale, or the entry needs a (subcommand) prefix)";
        }
      }
    }

    // ENVIRONMENT, both ways.
    std::set<std::string> help_envs;
    for (const auto& [command, help] : helps) help_envs.insert(help.envs.begin(), help.envs.end());
    std::string env_section;
    for (const auto& line : section_lines(text, "ENVIRONMENT")) env_section += line + "\n";
    const std::set<std::string> page_envs = envs_in(env_section);
    for (const auto& v : help_envs) {
      EXPECT_TRUE(page_envs.count(v)) << page << ": ENVIRONMENT does not document " << v << " (in --help)";
    }
    for (const auto& v : page_envs) {
      EXPECT_TRUE(help_envs.count(v) || read_by_getenv.count(v))
          << page << ": ENVIRONMENT documents " << v << ", which no " << tool
          << " --help names and no source reads with getenv() (stale?)";
    }
  }
  EXPECT_GT(tools, 0) << "no mc-* tools in " << bin;
}

TEST(ManSync, OverviewPageExists) { EXPECT_TRUE(fs::exists(fs::path(MC_SOURCE_DIR) / "man" / "mc.7")); }

}  // namespace
