// The stdio transport: newline-delimited JSON-RPC on stdin and stdout (jsonrpc.hpp StdioServer).
#include "session.hpp"

namespace kgate::mcp {

namespace {

// Reads an istream one line at a time, holding no more than `max` bytes of any line.
class LineReader {
 public:
  enum class Status { line, too_long, eof };

  LineReader(std::istream& in, std::size_t max) : in_(in), max_(max), chunk_(kReadChunk) {}

  // Reads the next line into `line`, without its '\n'. A last line with no '\n' still counts.
  // A line longer than the limit is read to its end and dropped; `length` then holds its size.
  Status next(std::string& line, std::size_t& length) {
    line.clear();
    length = 0;
    bool extracted = false;
    bool too_long = false;
    for (;;) {
      if (in_.bad()) return extracted ? finish(line, too_long) : Status::eof;
      in_.getline(chunk_.data(), static_cast<std::streamsize>(chunk_.size()));
      const auto n = static_cast<std::size_t>(in_.gcount());
      std::size_t stored = n;
      bool end_of_line = true;
      if (in_.eof()) {
        if (n == 0 && !extracted) return Status::eof;
      } else if (in_.fail()) {  // the chunk filled up before the '\n'
        in_.clear();
        end_of_line = false;
      } else {
        stored = n - 1;  // gcount counted the '\n'
      }
      extracted = true;
      length += stored;
      if (length > max_) {
        if (!too_long) std::string().swap(line);  // let go of what was kept
        too_long = true;
      } else {
        line.append(chunk_.data(), stored);
      }
      if (end_of_line) return finish(line, too_long);
    }
  }

 private:
  static Status finish(std::string& line, bool too_long) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    return too_long ? Status::too_long : Status::line;
  }

  std::istream& in_;
  std::size_t max_;
  std::vector<char> chunk_;
};

}  // namespace

// ---------------------------------------------------------------------------------------
// stdio

struct StdioServer::Impl {
  Impl(ToolHandler& h, std::istream& i, std::ostream& o, ServerOptions op)
      : in(i), out(o), opts(op), session(h, std::move(op)) {}

  // Writes one message as one line, from any thread. False if it was not written.
  bool write(const json& msg) {
    std::string line;
    try {
      line = msg.dump(-1, ' ', false, json::error_handler_t::replace);
    } catch (const std::exception& e) {
      log().error("cannot serialize a message: {}", e.what());
      return false;
    }
    std::lock_guard lock(write_mutex);
    out.write(line.data(), static_cast<std::streamsize>(line.size()));
    out.put('\n');
    out.flush();
    if (!out) {
      if (!failed) log().warn("stdout: write failed; replies from now on are lost");
      failed = true;
      return false;
    }
    return true;
  }

  std::istream& in;
  std::ostream& out;
  ServerOptions opts;
  std::mutex write_mutex;
  bool failed = false;
  McpSession session;
};

StdioServer::StdioServer(ToolHandler& handler, std::istream& in, std::ostream& out, ServerOptions opts)
    : impl_(std::make_unique<Impl>(handler, in, out, std::move(opts))) {}

StdioServer::~StdioServer() = default;

void StdioServer::stop() { impl_->session.close(); }

int StdioServer::run() {
  Impl& s = *impl_;
  // std::cin is tied to std::cout: each read would flush cout from this thread, unlocked,
  // while a worker thread writes to it under the write mutex.
  s.in.tie(nullptr);
  // Every message goes out as one line; the impl (and so the sink) outlives any call's thread
  // that may still write: a call abandoned at EOF writes nothing once the session is closed.
  Sink line = [&s](const json& msg) { return msg.is_null() || s.write(msg); };
  LineReader reader(s.in, s.opts.max_line_bytes);
  std::string text;
  std::size_t length = 0;
  for (;;) {
    const LineReader::Status status = reader.next(text, length);
    if (status == LineReader::Status::eof) break;
    if (status == LineReader::Status::too_long) {
      log().warn("stdin: a message of {} bytes is over the {} byte limit, skipped", length, s.opts.max_line_bytes);
      s.write(make_error(nullptr, rpc_error::kParseError,
                         "Parse error: a message of " + std::to_string(length) + " bytes exceeds the limit of " +
                             std::to_string(s.opts.max_line_bytes) + " bytes; it was skipped"));
      continue;
    }
    s.session.handle(text, line);
  }
  log().debug("stdin: EOF");
  s.session.close();
  return 0;
}

}  // namespace kgate::mcp
