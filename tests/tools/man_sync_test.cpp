// Every tool in build/bin has a man page, and every --flag its --help (and each subcommand's --help)
// prints appears in that page. Runs over whatever tools exist, so a new tool is covered by itself.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace {

namespace fs = std::filesystem;

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

// Long flags in CLI11 help output.
std::set<std::string> flags_of(const std::string& help) {
  std::set<std::string> out;
  static const std::regex re("(^|[\\s,\\[])(--[a-z0-9][a-z0-9-]*)");
  for (auto it = std::sregex_iterator(help.begin(), help.end(), re); it != std::sregex_iterator(); ++it) {
    out.insert((*it)[2].str());
  }
  return out;
}

// Environment variables named in CLI11 help output ("(Env:MC_LOG_LEVEL)").
std::set<std::string> envs_of(const std::string& help) {
  std::set<std::string> out;
  static const std::regex re("Env:(MC_[A-Z0-9_]+)");
  for (auto it = std::sregex_iterator(help.begin(), help.end(), re); it != std::sregex_iterator(); ++it) {
    out.insert((*it)[1].str());
  }
  return out;
}

// Subcommand names listed under "SUBCOMMANDS:" in CLI11 help output.
std::set<std::string> subcommands_of(const std::string& help) {
  std::set<std::string> out;
  std::istringstream in(help);
  std::string line;
  bool in_section = false;
  static const std::regex re("^  ([a-z][a-z0-9-]*)( .*)?$");
  while (std::getline(in, line)) {
    if (line.rfind("SUBCOMMANDS:", 0) == 0 || line.rfind("Subcommands:", 0) == 0) {
      in_section = true;
      continue;
    }
    if (in_section) {
      std::smatch m;
      if (std::regex_match(line, m, re))
        out.insert(m[1].str());
      else if (!line.empty() && line[0] != ' ')
        in_section = false;
    }
  }
  return out;
}

// Man page text with roff escapes for '-' and fonts removed.
std::string man_text(const fs::path& page) {
  std::ifstream in(page);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  s = std::regex_replace(s, std::regex("\\\\-"), "-");
  s = std::regex_replace(s, std::regex("\\\\f[BIRP]"), "");
  return s;
}

TEST(ManSync, EveryToolHasAPageListingEveryFlag) {
  const fs::path bin = fs::path(MC_BINARY_DIR) / "bin";
  const fs::path man = fs::path(MC_SOURCE_DIR) / "man";
  ASSERT_TRUE(fs::exists(bin)) << bin;
  int tools = 0;
  for (const auto& entry : fs::directory_iterator(bin)) {
    const std::string tool = entry.path().filename().string();
    if (tool.rfind("mc-", 0) != 0) continue;
    ++tools;
    const fs::path page = man / (tool + ".1");
    ASSERT_TRUE(fs::exists(page)) << tool << " has no man page " << page;
    const std::string text = man_text(page);
    // Quotes around a two-word section name are optional in roff.
    const std::string unquoted = std::regex_replace(text, std::regex("\\.SH \"([^\"]*)\""), ".SH $1");
    for (const char* section : {".SH NAME", ".SH SYNOPSIS", ".SH DESCRIPTION", ".SH OPTIONS", ".SH ENVIRONMENT",
                                ".SH EXIT STATUS", ".SH EXAMPLES", ".SH SEE ALSO"}) {
      EXPECT_NE(unquoted.find(section), std::string::npos) << page << " lacks section " << section;
    }
    const std::string help = run(entry.path().string() + " --help 2>&1");
    ASSERT_FALSE(help.empty()) << tool << " --help printed nothing";
    std::set<std::string> flags = flags_of(help);
    std::set<std::string> envs = envs_of(help);
    for (const auto& sub : subcommands_of(help)) {
      const std::string sub_help = run(entry.path().string() + " " + sub + " --help 2>&1");
      EXPECT_NE(text.find(sub), std::string::npos) << page << " does not mention subcommand " << sub;
      for (const auto& f : flags_of(sub_help)) flags.insert(f);
      for (const auto& e : envs_of(sub_help)) envs.insert(e);
    }
    for (const auto& e : envs) {
      EXPECT_NE(text.find(e), std::string::npos) << page << " does not document environment variable " << e;
    }
    flags.erase("--help");  // CLI11 adds it everywhere; every page need not say so
    for (const auto& f : flags) {
      EXPECT_NE(text.find(f), std::string::npos)
          << page << " does not document " << f << " (from " << tool << " --help)";
    }
  }
  EXPECT_GT(tools, 0) << "no mc-* tools in " << bin;
}

TEST(ManSync, OverviewPageExists) { EXPECT_TRUE(fs::exists(fs::path(MC_SOURCE_DIR) / "man" / "mc.7")); }

}  // namespace
