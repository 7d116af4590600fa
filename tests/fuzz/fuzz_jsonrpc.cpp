// Fuzz target: kgate-mcp's JSON-RPC reader (translator/jsonrpc.hpp).  The input is what a
// client writes on stdin, one message per line; the StdioServer runs to EOF against a tool
// handler with one tool that echoes its arguments.  Invariants: run() returns, and every line
// written is one JSON object.
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

#include "kgate/mcp/jsonrpc.hpp"

namespace {

using kgate::json;
namespace mcp = kgate::mcp;

void must(bool ok) {
  if (!ok) std::abort();
}

class EchoTools : public mcp::ToolHandler {
 public:
  json tool_list() const override {
    return json::array({{{"name", "echo"},
                         {"description", "echo the arguments"},
                         {"inputSchema", {{"type", "object"}}}}});
  }
  mcp::ToolReply call(mcp::Call& call) override {
    if (call.arguments.contains("bad")) throw mcp::InvalidParams("bad argument");
    if (call.arguments.contains("fail")) throw std::runtime_error("tool failed");
    call.progress(1, 2, "half");
    mcp::ToolReply r;
    r.content.push_back({{"type", "text"}, {"text", call.arguments.dump()}});
    return r;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static EchoTools tools;
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  std::ostringstream out;
  mcp::ServerOptions opts;
  opts.max_line_bytes = 1 << 16;
  opts.max_concurrent = 4;
  opts.eof_grace = std::chrono::milliseconds(1000);
  opts.instructions = "fuzz";
  {
    mcp::StdioServer server(tools, in, out, opts);
    must(server.run() == 0);
  }
  std::istringstream lines(out.str());
  for (std::string line; std::getline(lines, line);) {
    auto j = json::parse(line, nullptr, false);
    must(!j.is_discarded() && j.is_object());
  }
  return 0;
}
