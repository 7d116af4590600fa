// The MCP tools' one table (translator/mcp/tool_table.cpp) as tools/list shows it, without a
// process: names, descriptions, schemas and annotations, and that tools/call dispatches through
// it.  The JSON-RPC side of tools/list (the same list every time, stdout clean) stays in
// tests/integration/test_mcp_transcript.py.
#include "kgate/mcp/tools.hpp"

#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <string>

#include "kgate/mcp/jsonrpc.hpp"

namespace kgate::mcp {
namespace {

json tools() {
  Translator t{Config{}};
  return t.tool_list();
}

TEST(ToolTable, NamesAreUniqueAndWhatClientsAccept) {
  const json list = tools();
  ASSERT_TRUE(list.is_array());
  std::set<std::string> names;
  const std::regex valid("^[a-z][a-z0-9_]{0,63}$");
  for (const auto& t : list) {
    const std::string name = t.at("name").get<std::string>();
    EXPECT_TRUE(std::regex_match(name, valid)) << name;
    EXPECT_TRUE(names.insert(name).second) << name << " is listed twice";
  }
  const std::set<std::string> expected = {"connect", "execute", "poll_job", "list_kernels", "stop_kernel",
                                          "restart", "interrupt", "server_status", "verify"};
  EXPECT_EQ(names, expected);
}

// What the model reads stays short: the details are in the docs and the parameters' own text.
TEST(ToolTable, EveryToolHasATitleAndAShortDescription) {
  for (const auto& t : tools()) {
    const std::string name = t.at("name");
    const std::string desc = t.at("description");
    EXPECT_FALSE(desc.empty()) << name;
    EXPECT_LE(desc.size(), 700u) << name;
    EXPECT_FALSE(t.at("title").get<std::string>().empty()) << name;
    EXPECT_EQ(t.at("annotations").at("title"), t.at("title")) << name;
    EXPECT_FALSE(t.contains("outputSchema")) << name << ": an outputSchema makes clients show images as text";
  }
}

// Each schema is a closed object whose required parameters exist, each with a type and a text.
TEST(ToolTable, SchemasAreClosedObjectsWithDescribedParameters) {
  for (const auto& t : tools()) {
    const std::string name = t.at("name");
    const json& s = t.at("inputSchema");
    EXPECT_EQ(s.at("type"), "object") << name;
    EXPECT_EQ(s.at("additionalProperties"), false) << name;
    const json& props = s.at("properties");
    ASSERT_TRUE(props.is_object()) << name;
    for (const auto& [param, p] : props.items()) {
      EXPECT_TRUE(p.contains("type")) << name << "." << param;
      EXPECT_FALSE(p.value("description", "").empty()) << name << "." << param;
    }
    if (s.contains("required")) {
      for (const auto& r : s.at("required")) {
        EXPECT_TRUE(props.contains(r.get<std::string>())) << name << ": " << r;
      }
    }
  }
}

// destructiveHint and idempotentHint mean something only for a tool that changes things; only
// execute may run as a task.
TEST(ToolTable, AnnotationsAndTaskSupport) {
  for (const auto& t : tools()) {
    const std::string name = t.at("name");
    const json& a = t.at("annotations");
    const bool read_only = a.at("readOnlyHint");
    EXPECT_EQ(a.contains("destructiveHint"), !read_only) << name;
    EXPECT_EQ(a.contains("idempotentHint"), !read_only) << name;
    EXPECT_TRUE(a.at("openWorldHint").is_boolean()) << name;
    if (name == "execute") {
      EXPECT_EQ(t.at("execution"), (json{{"taskSupport", "optional"}}));
    } else {
      EXPECT_FALSE(t.contains("execution")) << name;
    }
  }
  for (const auto& t : tools()) {
    if (t.at("name") == "poll_job" || t.at("name") == "list_kernels" || t.at("name") == "server_status") {
      EXPECT_TRUE(t.at("annotations").at("readOnlyHint").get<bool>()) << t.at("name");
    }
  }
}

TEST(ToolTable, TheListIsTheSameEveryTime) { EXPECT_EQ(tools(), tools()); }

// tools/call goes through the same table: a name not in it is an InvalidParams, and arguments
// that are not an object are refused before any tool runs.
TEST(ToolTable, CallsAreDispatchedThroughTheTable) {
  Translator t{Config{}};
  Call unknown;
  unknown.tool = "no_such_tool";
  EXPECT_THROW(
      {
        try {
          t.call(unknown);
        } catch (const InvalidParams& e) {
          EXPECT_STREQ(e.what(), "Unknown tool: no_such_tool");
          throw;
        }
      },
      InvalidParams);
  Call bad;
  bad.tool = "server_status";
  bad.arguments = json::array();
  EXPECT_THROW(t.call(bad), InvalidParams);
  // A known tool runs: execute without code is refused by the tool itself, not as unknown.
  Call execute;
  execute.tool = "execute";
  try {
    t.call(execute);
    ADD_FAILURE() << "execute without code was not refused";
  } catch (const InvalidParams& e) {
    EXPECT_STREQ(e.what(), "'code' (a string) is required");
  }
}

}  // namespace
}  // namespace kgate::mcp
