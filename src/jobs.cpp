// Job records: every cell run in kgate's kernels, built from the protocol, kept in memory.
#include "kgate/jobs.hpp"
#include "kgate/kernel_side.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iomanip>
#include <memory>
#include <optional>
#include <sstream>

#include <simdjson.h>
#include <spdlog/spdlog.h>

#include "kgate/connection.hpp"
#include "kgate/utf8.hpp"

namespace kgate {

namespace {

// A running job's output is written to its records on disk at most this often (its start and
// end are written at once).
constexpr std::chrono::seconds kRunningLogEvery{5};

constexpr std::string_view kEndLost =
    "This job has ended, but how was not recorded (its end was lost: a later cell ran). Its "
    "output is complete as far as it goes.";

bool continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// The first byte at or after `i` that starts a UTF-8 sequence.  Every recorded text is valid
// UTF-8, so a character has at most three continuation bytes: no more are skipped, whatever the
// bytes (a cut never eats more than one character).
std::size_t utf8_boundary(std::string_view s, std::size_t i) {
  for (int k = 0; k < 3 && i < s.size() && continuation(s[i]); ++k) ++i;
  return i;
}

// The head of `s` in at most `cap` bytes, cut at a UTF-8 boundary (at most three bytes back).
std::size_t utf8_head(std::string_view s, std::size_t cap) {
  if (s.size() <= cap) return s.size();
  std::size_t i = cap;
  for (int k = 0; k < 3 && i > 0 && continuation(s[i]); ++k) --i;
  return i;
}

// Kernel text as it enters a record: valid UTF-8 (ill-formed bytes become U+FFFD).
void append_valid(TailText& t, std::string_view s) {
  if (is_valid_utf8(s)) t.append(s);
  else t.append(valid_utf8(s));
}

// A message part parsed as JSON.  A kernel may send bytes that are not UTF-8 inside its strings
// (ipykernel's surrogateescape), which the parser refuses: then the part is parsed again with
// them replaced by U+FFFD, so the text around them is kept.
json parse_part(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() && !is_valid_utf8(text)) j = json::parse(valid_utf8(text), nullptr, false);
  return j;
}

// Kernel text without its escape sequences, as valid UTF-8 (evalue, traceback lines).
std::string plain_text(std::string_view s) {
  std::string out = strip_ansi(s);
  make_valid_utf8(out);
  return out;
}

const std::string* str_field(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? &it->get_ref<const std::string&>() : nullptr;
}

// A string field's value, "" when it is absent or not a string (json::value would throw).
std::string str_value(const json& j, const char* key) {
  const std::string* s = str_field(j, key);
  return s ? *s : std::string();
}

std::optional<int> int_field(const json& j, const char* key) {
  auto it = j.find(key);
  if (it != j.end() && it->is_number_integer()) return it->get<int>();
  return std::nullopt;
}

// A stream message's "text", recorded without copying or unescaping the whole message at once
// (a flood sends messages of 1-20 MB, and each fresh buffer of that size costs a page fault per
// 4 KiB on top of the copy).  simdjson finds the text's token in the content: in place when the
// content has simdjson's padding spare in its capacity (kgate::decode reserves it), else in a
// padded copy.  The token is then unescaped by simdjson a chunk at a time into two small buffers
// kept per thread.  Chunks so far from the end that none of their text can be in the job's kept
// tail are only counted (TailText::skip): each byte of output takes at most 6 bytes of JSON
// (`\u0001`), so the last 6 x cap bytes of the token always unescape to at least cap bytes.
constexpr std::size_t kReusedParserBytes = 256u << 10;
constexpr std::size_t kChunkBytes = 256u << 10;
static_assert(simdjson::SIMDJSON_PADDING <= kJsonPadding, "kgate::decode must reserve simdjson's padding");

// Where the JSON string body `raw` (no quotes) may be cut at or before `want` (> from) without
// splitting an escape (`\x`, `\uXXXX`, or a `\uD8xx\uDCxx` pair) or a UTF-8 sequence, scanning
// from `from`, a point known to be between two of them.  Only the escapes' lengths are read
// here; simdjson decodes them.
std::size_t cut_point(std::string_view raw, std::size_t from, std::size_t want) {
  std::size_t pos = from;
  while (true) {
    std::size_t b = raw.find('\\', pos);
    if (b == std::string_view::npos || b >= want) break;
    std::size_t len = b + 1 < raw.size() && raw[b + 1] == 'u' ? 6 : 2;
    if (len == 6 && b + 12 <= raw.size() && raw[b + 6] == '\\' && raw[b + 7] == 'u' &&
        (raw[b + 2] == 'd' || raw[b + 2] == 'D')) {
      char c = raw[b + 3];
      if (c == '8' || c == '9' || c == 'a' || c == 'b' || c == 'A' || c == 'B')
        len = 12;  // a high surrogate and what follows it decode as one character
    }
    if (b + len > want) return b > from ? b : b + len;  // the cut would split this escape
    pos = b + len;
  }
  std::size_t cut = want;
  while (cut > from && continuation(raw[cut])) --cut;
  return cut > from ? cut : want;
}

struct StreamReader {
  simdjson::ondemand::parser parser;
  simdjson::padded_string padded;
  simdjson::ondemand::document doc;
  // The body of content's "text" string token, a view of `content` or of `padded`.
  bool token(const std::string& content, std::string_view& body) {
    simdjson::error_code err;
    if (content.capacity() >= content.size() + simdjson::SIMDJSON_PADDING) {
      err = parser.iterate(simdjson::padded_string_view(content.data(), content.size(), content.capacity()))
                .get(doc);
    } else {
      padded = simdjson::padded_string(content);
      err = parser.iterate(padded).get(doc);
    }
    if (err == simdjson::UTF8_ERROR) {  // bytes that are not UTF-8 (see parse_part): replaced
      padded = simdjson::padded_string(valid_utf8(content));
      err = parser.iterate(padded).get(doc);
    }
    if (err) return false;
    simdjson::ondemand::value text;
    simdjson::ondemand::json_type type;
    if (doc["text"].get(text) || text.type().get(type) || type != simdjson::ondemand::json_type::string)
      return false;
    std::string_view tok = text.raw_json_token();
    while (!tok.empty() && tok.back() != '"') tok.remove_suffix(1);  // the spaces after it
    if (tok.size() < 2 || tok.front() != '"') return false;
    body = tok.substr(1, tok.size() - 2);
    return true;
  }
};

// The two chunk buffers, and a parser only for its unescaper; one per thread (the kernel I/O
// thread in kgate): 2 x (kChunkBytes + padding) held for the thread's life.
struct Unescaper {
  simdjson::ondemand::parser parser;
  // A chunk is at most kChunkBytes plus one escape (12 bytes) that began before its end.
  static constexpr std::size_t kMax = kChunkBytes + 16;
  std::unique_ptr<std::uint8_t[]> in{new std::uint8_t[kMax + 1 + simdjson::SIMDJSON_PADDING]};
  std::unique_ptr<std::uint8_t[]> out{new std::uint8_t[kMax + simdjson::SIMDJSON_PADDING]};
  Unescaper() {
    if (parser.allocate(simdjson::SIMDJSON_PADDING) != simdjson::SUCCESS) throw std::bad_alloc();
  }
  bool unescape(std::string_view raw, std::string_view& text) {
    std::memcpy(in.get(), raw.data(), raw.size());
    in[raw.size()] = '"';
    std::memset(in.get() + raw.size() + 1, 0, simdjson::SIMDJSON_PADDING);
    std::uint8_t* dst = out.get();
    return !parser.unescape(simdjson::ondemand::raw_json_string(in.get()), dst).get(text);
  }
};

// Appends the stream text of `content` to `out`, valid UTF-8 (see append_valid).  False when the
// content is not a stream message's JSON; what was appended before a bad escape stays.
bool record_stream_text(const std::string& content, TailText& out) {
  std::string_view body;
  std::optional<StreamReader> own;
  StreamReader* reader;
  if (content.size() <= kReusedParserBytes) {
    static thread_local StreamReader reused;
    reader = &reused;
  } else {
    reader = &own.emplace();  // its buffers go with it, not kept for the thread's life
  }
  if (!reader->token(content, body)) return false;
  static thread_local Unescaper unescaper;
  // Where the chunks that may reach the kept tail begin.
  const std::size_t tail_from =
      out.cap() && body.size() / 6 > out.cap() ? body.size() - 6 * out.cap() : 0;
  for (std::size_t pos = 0; pos < body.size();) {
    std::size_t want = std::min(body.size(), pos + kChunkBytes);
    if (pos < tail_from) want = std::min(want, tail_from);
    std::size_t cut = want == body.size() ? want : cut_point(body, pos, want);
    std::string_view text;
    if (!unescaper.unescape(body.substr(pos, cut - pos), text)) return false;
    if (cut <= tail_from) {
      out.skip(is_valid_utf8(text) ? text.size() : valid_utf8(text).size());
    } else {
      append_valid(out, text);
    }
    pos = cut;
  }
  return true;
}

}  // namespace

std::string_view origin_name(JobOrigin o) noexcept {
  switch (o) {
    case JobOrigin::mcp: return "mcp";
    case JobOrigin::user: return "user";
    case JobOrigin::host: return "host";
  }
  return "user";
}

std::string_view status_name(JobStatus s) noexcept {
  switch (s) {
    case JobStatus::running: return "running";
    case JobStatus::ok: return "ok";
    case JobStatus::error: return "error";
    case JobStatus::interrupted: return "interrupted";
    case JobStatus::aborted: return "aborted";
    case JobStatus::kernel_lost: return "kernel_lost";
    case JobStatus::end_not_recorded: return "end_not_recorded";
    case JobStatus::culled: return "culled";
  }
  return "running";
}

std::string_view refusal_name(Refusal r) noexcept {
  switch (r) {
    case Refusal::none: return "";
    case Refusal::disabled: return "disabled";
    case Refusal::busy: return "busy";
    case Refusal::claimed: return "claimed";
    case Refusal::not_running: return "not_running";
    case Refusal::not_begun: return "not_begun";
    case Refusal::not_owner: return "not_owner";
    case Refusal::foreign_job: return "foreign_job";
    case Refusal::no_such_job: return "no_such_job";
    case Refusal::no_such_kernel: return "no_such_kernel";
    case Refusal::no_process: return "no_process";
    case Refusal::no_input_request: return "no_input_request";
  }
  return "";
}

// An escape sequence is ESC and ASCII bytes only, so what is removed never takes a byte of a
// multi-byte character and valid UTF-8 stays valid:
// - CSI: ESC [, parameter and intermediate bytes 0x20-0x3F, a final byte 0x40-0x7E;
// - OSC, DCS, SOS, PM, APC (ESC ] P X ^ _): a string up to BEL, ST (ESC backslash) or the line's end;
//   the string may hold any text, which goes with it;
// - the short forms: ESC, intermediates 0x20-0x2F, a final byte 0x30-0x7E (ESC ( B, ESC =).
// A malformed sequence ends at the first byte that cannot be part of it; that byte is kept.
std::string strip_ansi(std::string_view s) {
  auto in = [&](std::size_t i, unsigned char lo, unsigned char hi) {
    return i < s.size() && static_cast<unsigned char>(s[i]) >= lo && static_cast<unsigned char>(s[i]) <= hi;
  };
  std::string out;
  out.reserve(s.size());
  std::size_t i = 0;
  while (i < s.size()) {
    if (s[i] != '\x1b') {
      out.push_back(s[i++]);
      continue;
    }
    ++i;
    if (i >= s.size()) break;
    const char k = s[i];
    if (k == '[') {
      ++i;
      while (in(i, 0x20, 0x3F)) ++i;
      if (in(i, 0x40, 0x7E)) ++i;
    } else if (k == ']' || k == 'P' || k == 'X' || k == '^' || k == '_') {
      ++i;
      while (i < s.size() && s[i] != '\a' && s[i] != '\x1b' && s[i] != '\n') ++i;
      if (i < s.size() && s[i] == '\a') ++i;
      else if (i + 1 < s.size() && s[i] == '\x1b' && s[i + 1] == '\\') i += 2;
      // else: an ESC that is not ST begins the next sequence; a newline is kept
    } else {
      while (in(i, 0x20, 0x2F)) ++i;
      if (in(i, 0x30, 0x7E)) ++i;
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// TailText

void TailText::append(std::string_view s) {
  total_ += s.size();
  if (cap_ && s.size() >= cap_) {
    // A piece as big as the cap replaces what was kept; only its tail is copied, and a buffer
    // grown by an earlier huge piece is given back.
    buf_.assign(s.substr(utf8_boundary(s, s.size() - cap_)));
    if (buf_.capacity() > 2 * cap_ + 64) buf_.shrink_to_fit();
    return;
  }
  buf_.append(s);
  // Compact only past twice the cap, so appends stay amortised O(1).
  if (cap_ && buf_.size() > 2 * cap_) {
    std::size_t from = utf8_boundary(buf_, buf_.size() - cap_);
    buf_.erase(0, from);
  }
}

void TailText::skip(std::size_t n) {
  total_ += n;
  buf_.clear();
}

std::string_view TailText::text() const {
  if (buf_.size() <= cap_ || cap_ == 0) return buf_;
  std::size_t from = utf8_boundary(buf_, buf_.size() - cap_);
  return std::string_view(buf_).substr(from);
}

void TailText::release() {
  buf_.clear();
  buf_.shrink_to_fit();
}

void TailText::restore(std::string text, std::size_t total) {
  buf_ = std::move(text);
  if (cap_ && buf_.size() > cap_) buf_.erase(0, utf8_boundary(buf_, buf_.size() - cap_));
  total_ = std::max(total, buf_.size());
}

// ---------------------------------------------------------------------------------------
// Job

double Job::elapsed(std::chrono::steady_clock::time_point now) const {
  auto from = began ? t_began : t_created;
  auto to = running() ? now : t_ended;
  return std::max(0.0, std::chrono::duration<double>(to - from).count());
}

std::size_t Job::bytes() const {
  std::size_t total = code.size() + output.held() + result.held() + ename.size() + evalue.size() + note.size();
  for (auto& t : traceback) total += t.size();
  return total;
}

// ---------------------------------------------------------------------------------------
// JobStore: recording

// The version starts at the wall clock in ms: a client long-polling with an earlier kgate's
// version is answered at once by the next kgate (whose versions are all greater), never told
// "nothing changed" because the two counters happened to meet.  Below 2^53: exact in JSON.
JobStore::JobStore(RecordLimits limits, std::string session)
    : limits_(limits),
      session_(session.empty() ? "kgate-" + new_hex_id() : std::move(session)),
      version_(static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                              std::chrono::system_clock::now().time_since_epoch())
                                              .count())) {}

Job* JobStore::find_locked(const std::string& id) {
  if (id.size() < 5 || id.compare(0, 4, "job-") != 0) return nullptr;
  std::uint64_t n = 0;
  for (std::size_t i = 4; i < id.size(); ++i) {
    if (id[i] < '0' || id[i] > '9' || n > (UINT64_MAX - 9) / 10) return nullptr;
    n = n * 10 + std::uint64_t(id[i] - '0');
  }
  auto it = jobs_.find(n);
  return it == jobs_.end() ? nullptr : &it->second;
}

Job* JobStore::by_request_locked(const std::string& request) {
  if (request.empty()) return nullptr;
  auto it = by_request_.find(request);
  if (it == by_request_.end()) return nullptr;
  auto j = jobs_.find(it->second);
  return j == jobs_.end() ? nullptr : &j->second;
}

Job* JobStore::running_locked(const std::string& kernel) {
  // Newest first: the one that began wins over a queued one.
  Job* queued = nullptr;
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    auto& j = jobs_.at(*it);
    if (j.kernel != kernel) continue;
    if (j.began) return &j;
    queued = &j;
  }
  return queued;
}

void JobStore::finished_locked(Job& j) {
  running_.erase(j.n);
  j.input.reset();  // an input() its end left unanswered
  {
    const double d = j.elapsed(j.t_ended);
    auto& h = stats_.duration[static_cast<std::size_t>(j.origin)];
    auto b = std::lower_bound(JobStats::kBuckets.begin(), JobStats::kBuckets.end(), d);
    if (b != JobStats::kBuckets.end()) ++h.bucket[static_cast<std::size_t>(b - JobStats::kBuckets.begin())];
    ++h.count;
    h.sum += d;
    ++stats_.ended[{j.origin, j.status}];
  }
  if (auto k = kernels_.find(j.kernel); k != kernels_.end()) k->second.last_ended = j.n;
  by_request_.erase(j.request);
  // Its execute_reply usually comes after its idle: keep the request a little longer.
  recent_.emplace_back(j.request, j.n);
  if (recent_.size() > 256) recent_.pop_front();
  if (j.seen_by_agent || j.origin != JobOrigin::user) evictable_.insert(j.n);
  changed_locked();
}

Job& JobStore::create_locked(const std::string& kernel, JobOrigin origin, std::string request,
                             std::string_view code) {
  std::string repaired;
  if (!is_valid_utf8(code)) code = repaired = valid_utf8(code);
  Job j;
  j.n = ++counter_;
  j.kernel = kernel;
  j.origin = origin;
  j.request = std::move(request);
  std::size_t keep = utf8_head(code, limits_.job_code_bytes);
  j.code = std::string(code.substr(0, keep));
  j.code_cut = code.size() - keep;
  j.output = TailText(limits_.job_output_bytes);
  j.result = TailText(limits_.job_output_bytes);
  j.created = iso_now();
  j.t_created = Clock::now();
  j.seen_by_agent = origin != JobOrigin::user;
  j.generation = kernels_[kernel].generation;
  if (!j.seen_by_agent) ++unseen_;
  bytes_ += j.bytes();
  if (!j.request.empty()) by_request_[j.request] = j.n;
  running_.insert(j.n);
  auto [it, _] = jobs_.emplace(j.n, std::move(j));
  changed_locked();
  dirty_locked(it->second);
  return it->second;
}

void JobStore::add_bytes(std::size_t before, const Job& j) {
  bytes_ = bytes_ - before + j.bytes();
}

void JobStore::end_locked(Job& j, JobStatus status, std::string note) {
  if (!j.running()) return;
  j.status = status;
  j.t_ended = Clock::now();
  j.ended_at = iso_now();
  std::size_t before = j.bytes();
  if (note.empty() && status != JobStatus::ok) note = j.stop_note;
  if (!note.empty()) j.note += (j.note.empty() ? "" : " ") + note;  // after a gap's note, if any
  add_bytes(before, j);
  dirty_locked(j);
  finished_locked(j);
  close_earlier_locked(j, j.began ? j.t_began : j.t_created);
}

void JobStore::begin_locked(Job& j) {
  j.began = true;
  j.t_began = Clock::now();
  j.began_at = iso_now();
  changed_locked();
  dirty_locked(j);
  close_earlier_locked(j, j.t_began);
}

void JobStore::close_earlier_locked(const Job& j, Clock::time_point since) {
  // Cells run one at a time: any other cell of this kernel that began before `since` has ended.
  // Only running jobs are looked at (a handful), never the whole record.
  if (j.task) return;  // a task runs beside the cells: it ends none
  std::vector<std::uint64_t> running(running_.begin(), running_.end());
  for (auto n : running) {
    auto it = jobs_.find(n);
    if (it == jobs_.end()) continue;
    Job& other = it->second;
    if (&other == &j || other.kernel != j.kernel || !other.running() || !other.began || other.task) continue;
    if (other.t_began > since) continue;  // began after this one: it is the next cell
    end_locked(other, JobStatus::end_not_recorded, std::string(kEndLost));
  }
}

void JobStore::lose_running_locked(const std::string& kernel, JobStatus status, const std::string& note) {
  std::vector<std::uint64_t> running(running_.begin(), running_.end());
  for (auto n : running) {
    Job& j = jobs_.at(n);
    if (j.kernel != kernel) continue;
    // Every running job of the kernel is lost here: no repair among them is needed.
    j.status = status;
    j.t_ended = Clock::now();
    j.ended_at = iso_now();
    std::size_t before = j.bytes();
    j.note += (j.note.empty() ? "" : " ") + note;
    add_bytes(before, j);
    dirty_locked(j);
    finished_locked(j);
  }
}

void JobStore::on_kernel_message(const KernelPtr& kernel, const KernelMessagePtr& msg) {
  if (!limits_.enabled) return;
  const auto& m = *msg;
  if (m.channel == Channel::stdin_ && m.msg_type == "input_request") {
    // An agent's cell asks for input (it was sent with allow_stdin): the record says so, and
    // the agent answers through answer_input.
    {
      std::lock_guard lk(mu_);
      Job* j = by_request_locked(m.parent_msg_id);
      if (!j || !j->running() || j->origin == JobOrigin::user) return;
      json content = parse_part(m.wire.content);
      Job::PendingInput in;
      if (content.is_object()) {
        if (auto* p = str_field(content, "prompt")) in.prompt = valid_utf8(*p);
        auto pw = content.find("password");
        in.password = pw != content.end() && pw->is_boolean() && pw->get<bool>();
      }
      in.header = m.wire.header;
      if (j->input_timeout.count() > 0) in.deadline = Clock::now() + j->input_timeout;
      j->input = std::move(in);
      changed_locked();
    }
    notify();
    return;
  }
  if (m.channel == Channel::iopub) {
    const auto& t = m.msg_type;
    if (t != "execute_input" && t != "stream" && t != "execute_result" && t != "error" && t != "status")
      return;
    {
      std::lock_guard lk(mu_);
      Job* j = by_request_locked(m.parent_msg_id);
      // Most iopub traffic is not a recorded cell's (kernel_info, comms): skip it unparsed.
      if (!j && t != "execute_input") return;
      if (t == "stream") {
        std::size_t before = j->bytes();
        record_stream_text(m.wire.content, j->output);
        add_bytes(before, *j);
        if (bytes_ > limits_.budget_bytes) enforce_locked();
        return;  // output is not a lifecycle change: nothing to notify
      }
      json content = parse_part(m.wire.content);
      if (!content.is_object()) return;
      if (t == "execute_input") {
        const std::string* code = str_field(content, "code");
        if (!j) {
          if (!code || code->empty()) return;  // empty code is never a cell
          json parent = json::parse(m.wire.parent_header, nullptr, false);
          const std::string* session = parent.is_object() ? str_field(parent, "session") : nullptr;
          // Ours (the agent path's session, or kgate's own with a kernel): not recorded here.
          if (session && is_host_session(*session, session_)) return;
          j = &create_locked(kernel->id(), JobOrigin::user, m.parent_msg_id, *code);
        }
        if (!j->began) begin_locked(*j);
        if (auto c = int_field(content, "execution_count")) {
          j->execution_count = *c;
          auto& pk = kernels_[kernel->id()];
          pk.last_count = std::max(pk.last_count, *c);
        }
      } else if (!j) {
        return;
      } else if (t == "execute_result") {
        auto data = content.find("data");
        if (data != content.end() && data->is_object())
          if (const std::string* text = str_field(*data, "text/plain")) {
            std::size_t before = j->bytes();
            append_valid(j->result, *text);
            add_bytes(before, *j);
          }
        if (auto c = int_field(content, "execution_count")) j->execution_count = *c;
      } else if (t == "error") {
        std::size_t before = j->bytes();
        if (auto* e = str_field(content, "ename")) j->ename = valid_utf8(*e);
        if (auto* e = str_field(content, "evalue")) j->evalue = plain_text(*e);
        j->traceback.clear();
        auto tb = content.find("traceback");
        std::size_t budget = limits_.job_output_bytes;
        if (tb != content.end() && tb->is_array())
          for (auto& line : *tb)
            if (line.is_string() && budget > 0) {
              std::string s = plain_text(line.get_ref<const std::string&>());
              if (s.size() > budget) s.resize(utf8_head(s, budget));
              budget -= s.size();
              j->traceback.push_back(std::move(s));
            }
        if (j->ename.empty()) j->ename = "Error";
        add_bytes(before, *j);
      } else if (t == "status") {
        const std::string* state = str_field(content, "execution_state");
        if (state && *state == "busy" && j->running() && !j->began) {
          // Its execute_input was lost, or it is silent (ipykernel echoes no silent cell).
          begin_locked(*j);
        } else if (state && *state == "idle" && j->running() && !j->task) {
          JobStatus st = JobStatus::ok;
          if (j->ename == "KeyboardInterrupt") st = JobStatus::interrupted;
          else if (!j->ename.empty() || j->reply_status == "error") st = JobStatus::error;
          end_locked(*j, st);
        }
      }
      if ((changed_ && jobs_.size() > limits_.max_jobs) || bytes_ > limits_.budget_bytes) enforce_locked();
    }
    notify();
    return;
  }
  if (m.channel != Channel::shell || m.msg_type != "execute_reply") return;
  json content = parse_part(m.wire.content);
  if (!content.is_object()) return;
  {
    std::lock_guard lk(mu_);
    if (auto it = kernels_.find(kernel->id()); it != kernels_.end()) it->second.inflight.erase(m.parent_msg_id);
    Job* j = by_request_locked(m.parent_msg_id);
    if (!j) {
      // Ended by its idle already: the kernel's reply can still correct an ok whose error was
      // lost.  kgate's own answer (a restart or shutdown failing what was still pending) cannot:
      // it says nothing of a cell that had run to its idle.
      if (m.synthesized) return;
      auto rit = std::find_if(recent_.rbegin(), recent_.rend(),
                              [&](auto& p) { return p.first == m.parent_msg_id; });
      auto it = rit == recent_.rend() ? jobs_.end() : jobs_.find(rit->second);
      if (it != jobs_.end() && it->second.status == JobStatus::ok &&
          str_value(content, "status") == "error") {
        auto& done = it->second;
        done.status = JobStatus::error;
        if (done.ename.empty()) {
          if (auto* e = str_field(content, "ename")) done.ename = valid_utf8(*e);
          if (auto* e = str_field(content, "evalue")) done.evalue = plain_text(*e);
        }
        changed_locked();
        dirty_locked(done);
      }
    } else if (m.synthesized && str_value(content, "ename") == "GatewayStopping") {
      // kgate stops and leaves the kernel running: the cell or task goes on, and the next kgate
      // ends its record (the gap) or goes on with it (a task).
    } else {
      std::string status = str_value(content, "status");
      j->reply_status = status;
      j->reply_at = Clock::now();
      if (auto c = int_field(content, "execution_count")) j->execution_count = *c;
      if (m.synthesized) {
        // kgate answered it: the kernel never ran it, or went away under it.
        std::string ename = str_value(content, "ename");
        std::string evalue = valid_utf8(str_value(content, "evalue"));
        bool gone = ename == "KernelDied" || ename == "KernelRestarted" || ename == "KernelShutdown";
        end_locked(*j, gone ? JobStatus::kernel_lost : JobStatus::aborted, evalue);
      } else if (status == "aborted") {
        end_locked(*j, JobStatus::aborted,
                   "The kernel aborted this request (an earlier cell failed with stop_on_error).");
      } else if (status == "error" && j->ename.empty()) {
        std::size_t before = j->bytes();
        if (auto* e = str_field(content, "ename")) j->ename = valid_utf8(*e);
        if (auto* e = str_field(content, "evalue")) j->evalue = plain_text(*e);
        add_bytes(before, *j);
      }
    }
    if ((changed_ && jobs_.size() > limits_.max_jobs) || bytes_ > limits_.budget_bytes) enforce_locked();
  }
  notify();
}

void JobStore::on_kernel_side_event(const KernelPtr& kernel, const json& content) {
  if (!limits_.enabled || !content.is_object()) return;
  const std::string event = str_value(content, "event");
  const std::string request = str_value(content, "request");
  if (event == "task_running") {  // the kernel side's install answered: `request` runs, or none
    std::lock_guard lk(mu_);
    std::vector<std::uint64_t> running(running_.begin(), running_.end());
    for (auto n : running) {
      auto it = jobs_.find(n);
      if (it == jobs_.end() || it->second.kernel != kernel->id()) continue;
      Job& j = it->second;
      if (!request.empty() && j.request == request) {
        j.task = true;  // its end comes as task_end, not from the gap
        j.gap_end_at.reset();
        dirty_locked(j);
      } else if (j.task) {
        end_locked(j, JobStatus::end_not_recorded,
                   j.gap ? "The task ended while kgate was away: its status and its last output were not heard."
                         : std::string(kEndLost));
      }
    }
    changed_locked();
    return;
  }
  if ((event != "task_start" && event != "task_end") || request.empty()) return;
  {
    std::lock_guard lk(mu_);
    Job* j = by_request_locked(request);
    if (event == "task_start") {
      // Tasks run one at a time: a task still running here lost its end.
      std::vector<std::uint64_t> running(running_.begin(), running_.end());
      for (auto n : running)
        if (auto it = jobs_.find(n); it != jobs_.end() && it->second.task && it->second.kernel == kernel->id() &&
                                     &it->second != j)
          end_locked(it->second, JobStatus::end_not_recorded, std::string(kEndLost));
      if (!j) return;  // a starting cell kgate has no record of
      j->task = true;
      if (!j->began) begin_locked(*j);  // a task closes no cell
      changed_locked();
      dirty_locked(*j);
    } else if (j && j->task && j->running()) {
      const std::string status = str_value(content, "status");
      std::size_t before = j->bytes();
      if (status != "ok" && j->ename.empty()) {  // its iopub error (bounded like a cell's) was not heard
        j->ename = valid_utf8(str_value(content, "ename"));
        j->evalue = plain_text(str_value(content, "evalue"));
        j->traceback.clear();
        if (auto tb = content.find("traceback"); tb != content.end() && tb->is_array())
          for (const auto& line : *tb)
            if (line.is_string()) j->traceback.push_back(plain_text(line.get<std::string>()));
      }
      add_bytes(before, *j);
      end_locked(*j, status == "ok" ? JobStatus::ok : status == "interrupted" ? JobStatus::interrupted : JobStatus::error);
    }
  }
  notify();
}

void JobStore::on_client_message(const KernelPtr& kernel, const ClientMessage& msg) {
  if (!limits_.enabled || msg.channel != Channel::shell || msg.msg_type != "execute_request" ||
      msg.route == kAgentRoute)
    return;
  json content = parse_part(msg.wire.content);
  if (!content.is_object()) return;
  const std::string* code = str_field(content, "code");
  if (!code || code->empty()) return;
  {
    std::lock_guard lk(mu_);
    auto& inflight = kernels_[kernel->id()].inflight;
    // Bounded by the kernel's pending table; this cap only guards a misuse of the observer.
    if (inflight.size() < 100000) inflight.insert(msg.msg_id);
    // silent does not hide a cell: it runs with full effect, but ipykernel echoes no
    // execute_input for it, so a kgate client's silent cell is recorded from its request.
    auto silent = content.find("silent");
    if (silent != content.end() && silent->is_boolean() && silent->get<bool>() && !by_request_locked(msg.msg_id))
      create_locked(kernel->id(), JobOrigin::user, msg.msg_id, *code);
  }
  notify();
}

void JobStore::on_kernel_lifecycle(const KernelPtr& kernel, KernelLifecycle event,
                                   const std::string& why) {
  if (!limits_.enabled) return;
  const std::string reason = valid_utf8(why);  // it goes into notes and restart marks
  {
    std::lock_guard lk(mu_);
    auto& pk = kernels_[kernel->id()];
    pk.inflight.clear();
    if (event == KernelLifecycle::culled) {
      // Its newest finished record says so (the one an agent reads last); running ones end
      // `culled`.  Newest first: a kernel's last record is usually among the last few.
      for (auto it = jobs_.rbegin(); it != jobs_.rend(); ++it) {
        Job& j = it->second;
        if (j.kernel != kernel->id()) continue;
        if (j.running()) continue;
        std::size_t before = j.bytes();
        j.note += (j.note.empty() ? "" : " ") + std::string("The kernel was ") + reason + " after this job.";
        add_bytes(before, j);
        dirty_locked(j);
        break;
      }
      lose_running_locked(kernel->id(), JobStatus::culled,
                          "The kernel was " + reason + " while this job ran.");
    } else {
      lose_running_locked(kernel->id(), JobStatus::kernel_lost,
                          "The kernel stopped before this job finished (" + reason + ").");
    }
    if (event == KernelLifecycle::restarting) {
      ++pk.generation;
      ++pk.restarts;
      pk.last_count = 0;
      marks_.push_back(RestartMark{kernel->id(), counter_, iso_now(), reason});
      if (marks_.size() > limits_.max_restart_marks) marks_.erase(marks_.begin());
      if (log_) {
        const auto& m = marks_.back();
        pending_lines_.emplace_back(
            kernel->id(), json{{"t", "restart"}, {"after_job", m.after_job}, {"at", m.at}, {"reason", m.reason}}.dump());
        dirty_kernel_locked(kernel->id());
      }
    }
    changed_locked();
    if (jobs_.size() > limits_.max_jobs) enforce_locked();
  }
  notify();
}

void JobStore::on_kernel_removed(const KernelPtr& kernel) {
  if (!limits_.enabled) return;
  {
    std::lock_guard lk(mu_);
    lose_running_locked(kernel->id(), JobStatus::kernel_lost,
                        "The kernel stopped before this job finished (the kernel was shut down).");
    kernels_.erase(kernel->id());
    if (log_) {
      // Its records stay in memory until evicted, but a later kgate has no kernel to show them with.
      log_->remove(kernel->id());
      log_->save_counter(counter_);
    }
    changed_locked();
    enforce_locked();
  }
  notify();
}

void JobStore::enforce_locked() {
  auto erase = [this](std::map<std::uint64_t, Job>::iterator it) {
    ++stats_.evicted;
    bytes_ -= it->second.bytes();
    if (!it->second.seen_by_agent) --unseen_;
    by_request_.erase(it->second.request);
    evictable_.erase(it->first);
    return jobs_.erase(it);
  };
  // Oldest evictable (finished, and seen or not foreign) first, while over the count or the
  // byte budget: O(log n) each, whatever sits unevictable in front.
  // Over the count alone, a kernel's last finished job stays: the request waiting on it reads it
  // first (with the records full of unseen foreign jobs, the job just ended is the only
  // evictable one).  So max_jobs may be passed by one job per kernel.  Over the byte budget
  // nothing is spared.
  for (auto ev = evictable_.begin();
       (jobs_.size() > limits_.max_jobs || bytes_ > limits_.budget_bytes) && ev != evictable_.end();) {
    auto it = jobs_.find(*ev);
    auto next = std::next(ev);
    if (bytes_ <= limits_.budget_bytes) {
      auto k = kernels_.find(it->second.kernel);
      if (k != kernels_.end() && k->second.last_ended == it->first) {
        ev = next;
        continue;
      }
    }
    erase(it);
    ev = next;
  }
  // What is left over the budget is unseen foreign jobs (and running ones): drop their text,
  // keep the record, so the agent is still told of them.
  for (auto it = jobs_.lower_bound(release_from_); it != jobs_.end() && bytes_ > limits_.budget_bytes; ++it) {
    Job& j = it->second;
    if (j.running() || j.released) continue;
    release_from_ = it->first;
    std::size_t before = j.bytes();
    j.output.release();
    j.result.release();
    j.traceback.clear();
    if (j.code.size() > 4096) {
      std::size_t keep = utf8_head(j.code, 4096);
      j.code_cut += j.code.size() - keep;
      j.code.resize(keep);
      j.code.shrink_to_fit();
    }
    j.released = true;
    j.note += (j.note.empty() ? "" : " ") +
              std::string("Its output was released: the records were over their memory budget.");
    add_bytes(before, j);
    dirty_locked(j);
  }
  // Past the unseen cap even those go; the digest counts them.
  for (auto it = jobs_.begin(); it != jobs_.end() && unseen_ > limits_.max_unseen_jobs;) {
    if (!it->second.running() && !it->second.seen_by_agent) {
      if (auto k = kernels_.find(it->second.kernel); k != kernels_.end()) ++k->second.evicted_unseen;
      it = erase(it);
    } else {
      ++it;
    }
  }
  // Restart marks before every remaining record say nothing any more.
  if (!jobs_.empty()) {
    std::uint64_t oldest = jobs_.begin()->first;
    marks_.erase(std::remove_if(marks_.begin(), marks_.end(),
                                [&](const RestartMark& r) { return r.after_job + 1 < oldest; }),
                 marks_.end());
  }
}

// "1 second", "300 seconds": rounded up.
static std::string seconds_text(double s) {
  long n = std::max(1L, std::lround(std::ceil(s)));
  return std::to_string(n) + (n == 1 ? " second" : " seconds");
}

std::vector<std::pair<std::string, std::string>> JobStore::sweep() {
  std::vector<std::pair<std::string, std::string>> unanswered;
  if (!limits_.enabled) return unanswered;
  {
    std::lock_guard lk(mu_);
    auto now = Clock::now();
    std::vector<std::uint64_t> running(running_.begin(), running_.end());
    for (auto n : running) {
      auto it = jobs_.find(n);
      if (it == jobs_.end()) continue;
      Job& j = it->second;
      // A task's starting cell is answered at once and the task runs on: its end is task_end,
      // never the reply grace (which ended every task "ok" 5 s in, while it ran on).
      if (j.running() && !j.task && j.reply_at && now - *j.reply_at >= limits_.reply_grace) {
        JobStatus st = JobStatus::ok;
        if (j.ename == "KeyboardInterrupt") st = JobStatus::interrupted;
        else if (!j.ename.empty() || j.reply_status == "error") st = JobStatus::error;
        end_locked(j, st);
      } else if (j.running() && j.gap_end_at && now >= *j.gap_end_at) {
        end_locked(j, JobStatus::end_not_recorded,
                   "It ended while kgate was away: its status and its last output were not heard.");
      } else if (j.running() && j.input && j.input->deadline && now >= *j.input->deadline) {
        // Nobody answered its input() (an MCP client that never retried): the caller interrupts it.
        j.input->deadline.reset();
        j.stop_note = "Its input() had no answer within " + seconds_text(std::chrono::duration<double>(j.input_timeout).count()) +
                      " (input_timeout), so kgate interrupted it.";
        unanswered.emplace_back(j.id(), j.agent);
        changed_locked();
      } else if (j.running() && log_ && j.output.total() != j.logged_total &&
                 now - j.logged_at >= kRunningLogEvery) {
        dirty_locked(j);  // a running job's output so far, for a kgate that is killed under it
      }
    }
    if (changed_ && jobs_.size() > limits_.max_jobs) enforce_locked();
  }
  notify();
  return unanswered;
}

void JobStore::notify() {
  bool changed;
  {
    std::lock_guard lk(mu_);
    persist_locked();
    changed = changed_;
    changed_ = false;
  }
  if (changed && on_change_) on_change_();
}

// ---------------------------------------------------------------------------------------
// JobStore: the agent path

ClaimView JobStore::claim_view_locked(const AgentRef& ref, Clock::time_point now) const {
  ClaimView v{ref.agent, ref.label};
  auto it = agents_.find(ref.agent);
  if (it == agents_.end()) return v;
  const Agent& a = it->second;
  v.ever_connected = a.ever_connected;
  v.connected = a.connections > 0;
  if (v.connected) {
    v.alive = true;
    return v;
  }
  auto idle = now - a.last_seen;
  v.idle_seconds = std::chrono::duration<double>(idle).count();
  v.alive = !a.exited && idle < limits_.claim_grace;
  if (v.alive) v.lapses_in = std::chrono::duration<double>(limits_.claim_grace - idle).count();
  return v;
}

bool JobStore::alive_locked(const std::string& agent, Clock::time_point now) const {
  return claim_view_locked(AgentRef{agent, ""}, now).alive;
}

static std::string holder_text(const ClaimView& h) {
  return h.label.empty() ? "agent " + h.agent : h.label + " (agent " + h.agent + ")";
}

// Why a live holder still counts, in words: connected, or within its grace (with when it lapses).
static std::string grace_text(const ClaimView& h) {
  return std::string(h.ever_connected ? "its connection to kgate dropped " : "it has no connection to kgate and made its last request ") +
         seconds_text(h.idle_seconds) + " ago; its claim lapses in " + seconds_text(h.lapses_in) +
         " unless it comes back";
}

Outcome JobStore::submit(const std::string& kernel, const AgentRef& agent, std::string code,
                         JobOrigin origin, const std::function<void(ClientMessage)>& send, bool allow_stdin,
                         const std::string& wire_code, std::chrono::milliseconds input_timeout) {
  Outcome out;
  make_valid_utf8(code);  // it is recorded and sent as JSON (from HTTP it is valid already)
  if (!limits_.enabled) {
    out.refusal = Refusal::disabled;
    out.message = "Job records are switched off in this kgate ([records] enabled = false)";
    return out;
  }
  {
    std::lock_guard lk(mu_);
    auto now = Clock::now();
    auto& ag = agents_[agent.agent];
    ag.last_seen = now;
    ag.exited = false;
    if (!agent.label.empty()) ag.label = agent.label;
    auto& pk = kernels_[kernel];
    if (pk.claim && pk.claim->agent != agent.agent && alive_locked(pk.claim->agent, now)) {
      out.refusal = Refusal::claimed;
      out.holder = claim_view_locked(*pk.claim, now);
      out.message = out.holder->connected
                        ? "This kernel is in use by another agent, " + holder_text(*out.holder) +
                              ", and only one agent runs code in a kernel. It cannot be taken over while "
                              "that agent is connected; the person at the machine can restart it from the "
                              "observe page."
                        : "This kernel is held by another agent, " + holder_text(*out.holder) + ": " +
                              grace_text(*out.holder) + ". Retry after that: the next execute then takes "
                              "the kernel over.";
      return out;
    }
    if (Job* r = running_locked(kernel)) {
      out.refusal = Refusal::busy;
      out.running_job = r->id();
      bool own = r->origin != JobOrigin::user && r->agent == agent.agent;
      const std::string who = r->origin == JobOrigin::user ? "user" : "other agent";
      out.message = r->task && own ? r->id() + " (yours), a background task, is running on this kernel; execute is "
                                               "refused while it runs: wait for it (poll_job) or stop it (interrupt)."
                    : r->task ? "The " + who + "'s background task " + r->id() +
                                    " is running on this kernel; execute is refused while it runs: wait for it "
                                    "(poll_job), or ask the " + who + " to stop it (it is not yours to stop)."
                    : own ? r->id() + " (yours) is still running on this kernel; wait for it or stop it "
                              "before starting another."
                        : "The " + who + " is running a cell (" + r->id() + ") in this kernel. Only one job runs "
                              "at a time and the agent does not queue: wait for it to end.";
      return out;
    }
    if (!pk.inflight.empty()) {
      out.refusal = Refusal::busy;
      out.message = "A client of this kernel has a cell queued or running (request " +
                    *pk.inflight.begin() + "); the agent does not queue: wait for it to end.";
      return out;
    }
    if (pk.claim && pk.claim->agent != agent.agent)
      spdlog::info("kernel {}: agent {} takes the claim over from {} (gone)", kernel, agent.agent,
                   pk.claim->agent);
    if (!pk.claim || pk.claim->agent != agent.agent) dirty_kernel_locked(kernel);
    pk.claim = agent;
    if (pk.claim->label.empty()) pk.claim->label = ag.label;

    json header = make_header("execute_request", session_);
    std::string msg_id = header["msg_id"].get<std::string>();
    // A background task's starting cell is kgate's call, not the agent's code: kept out of the
    // kernel's history.
    json content = {{"code", wire_code.empty() ? code : wire_code}, {"silent", false},
                    {"store_history", wire_code.empty()},
                    {"user_expressions", json::object()}, {"allow_stdin", allow_stdin},
                    {"stop_on_error", false}};
    Job& j = create_locked(kernel, origin, msg_id, code);
    j.agent = valid_utf8(agent.agent);  // an agent's id and label may come from a URL's query
    j.label = valid_utf8(pk.claim->label);
    if (allow_stdin) j.input_timeout = input_timeout;
    out.job = j.id();
    ClientMessage cm;
    cm.channel = Channel::shell;
    cm.msg_id = msg_id;
    cm.msg_type = "execute_request";
    cm.route = std::string(kAgentRoute);
    cm.wire.header = header.dump();
    cm.wire.parent_header = "{}";
    cm.wire.metadata = "{}";
    cm.wire.content = content.dump();
    send(std::move(cm));  // posts to the I/O thread: the record exists before any reply can
  }
  notify();
  return out;
}

Outcome JobStore::interrupt(const std::string& id, const AgentRef* agent,
                            const std::function<bool(const std::string& request)>& interrupt) {
  Outcome out;
  out.job = id;
  {
    std::lock_guard lk(mu_);
    auto now = Clock::now();
    if (agent) {
      auto& ag = agents_[agent->agent];
      ag.last_seen = now;
      ag.exited = false;
    }
    Job* j = find_locked(id);
    if (!j) {
      out.refusal = Refusal::no_such_job;
      out.message = "No such job '" + id + "'.";
      return out;
    }
    Job* now_running = running_locked(j->kernel);
    if (now_running && now_running != j) out.running_job = now_running->id();
    if (!j->running()) {
      out.refusal = Refusal::not_running;
      out.message = id + " is no longer running (it ended " + std::string(status_name(j->status)) + ")" +
                    (out.running_job.empty() ? "; nothing runs on its kernel now."
                                             : "; " + out.running_job + " is running now. Look at it before deciding to stop it.");
      return out;
    }
    if (agent) {
      auto& pk = kernels_[j->kernel];
      if (pk.claim && pk.claim->agent != agent->agent && alive_locked(pk.claim->agent, now)) {
        out.refusal = Refusal::not_owner;
        out.holder = claim_view_locked(*pk.claim, now);
        out.message = "This kernel is held by another agent, " + holder_text(*out.holder) +
                      (out.holder->connected ? "" : " (" + grace_text(*out.holder) + ")") +
                      "; only its holder (or the person at the machine) may stop its jobs.";
        return out;
      }
      if (j->origin == JobOrigin::user || j->agent != agent->agent) {
        out.refusal = Refusal::foreign_job;
        out.message = "Refused: " + id + " was started by " +
                      (j->origin == JobOrigin::user ? std::string("the user") : "another agent") +
                      ", not by you; it is not yours to stop. Wait for it (the user can stop it).";
        return out;
      }
    }
    if (!j->began) {
      out.refusal = Refusal::not_begun;
      out.message = id + " has not begun: it is queued in the kernel behind another request, and a "
                         "stop now would interrupt that one instead.";
      return out;
    }
    if (!interrupt(j->request)) {
      out.refusal = Refusal::no_process;
      out.message = "The kernel process of " + id + " is not running.";
      return out;
    }
    if (!agent) j->stop_note = "Stopped by the person at the machine.";
    changed_locked();
  }
  notify();
  return out;
}

void JobStore::stop_missed(const std::string& id) {
  std::lock_guard lk(mu_);
  if (Job* j = find_locked(id)) j->stop_note.clear();
}

std::string JobStore::job_for_request(const std::string& msg_id) const {
  std::lock_guard lk(mu_);
  auto it = by_request_.find(msg_id);
  if (msg_id.empty() || it == by_request_.end()) return {};
  auto j = jobs_.find(it->second);
  return j == jobs_.end() ? std::string() : j->second.id();
}

Outcome JobStore::restart_gate(const std::string& kernel, const AgentRef* agent) {
  Outcome out;
  {
    std::lock_guard lk(mu_);
    auto now = Clock::now();
    auto& pk = kernels_[kernel];
    if (agent) {
      auto& ag = agents_[agent->agent];
      ag.last_seen = now;
      ag.exited = false;
      if (pk.claim && pk.claim->agent != agent->agent && alive_locked(pk.claim->agent, now)) {
        out.refusal = Refusal::not_owner;
        out.holder = claim_view_locked(*pk.claim, now);
        out.message = "This kernel is held by another agent, " + holder_text(*out.holder) +
                      (out.holder->connected ? "" : " (" + grace_text(*out.holder) + ")") +
                      "; only its holder may restart it. Restarting it is the user's to do, from the "
                      "observe page.";
        return out;
      }
      if (pk.claim && pk.claim->agent != agent->agent) {
        pk.claim.reset();
        dirty_kernel_locked(kernel);
      }
    } else {
      if (pk.claim) dirty_kernel_locked(kernel);
      pk.claim.reset();  // the person at the machine clears a stale claim
    }
    changed_locked();
  }
  notify();
  return out;
}

void JobStore::agent_connected(const AgentRef& agent) {
  std::lock_guard lk(mu_);
  auto& a = agents_[agent.agent];
  ++a.connections;
  a.exited = false;
  a.ever_connected = true;
  a.last_seen = Clock::now();
  if (!agent.label.empty()) a.label = agent.label;
}

void JobStore::agent_disconnected(const std::string& agent, bool clean) {
  {
    std::lock_guard lk(mu_);
    auto it = agents_.find(agent);
    if (it == agents_.end()) return;
    auto& a = it->second;
    if (a.connections > 0) --a.connections;
    a.last_seen = Clock::now();
    if (a.connections == 0 && clean) a.exited = true;
    changed_locked();
  }
  notify();
}

std::optional<JobStore::Gone> JobStore::agent_gone(const std::string& agent) const {
  std::lock_guard lk(mu_);
  auto it = agents_.find(agent);
  if (it == agents_.end()) return std::nullopt;
  const Agent& a = it->second;
  if (a.connections > 0) return std::nullopt;
  const auto now = Clock::now();
  const auto since = a.exited ? a.last_seen : a.last_seen + limits_.claim_grace;
  if (now < since) return std::nullopt;
  return Gone{std::chrono::duration_cast<std::chrono::milliseconds>(now - since), a.label};
}

void JobStore::expect_agent(const std::string& agent) {
  std::lock_guard lk(mu_);
  auto [it, added] = agents_.try_emplace(agent);
  if (added) it->second.last_seen = Clock::now();
}

void JobStore::touch_agent(const AgentRef& agent) {
  std::lock_guard lk(mu_);
  auto& a = agents_[agent.agent];
  a.last_seen = Clock::now();
  a.exited = false;
  if (!agent.label.empty()) a.label = agent.label;
}

// ---------------------------------------------------------------------------------------
// JobStore: reads

std::optional<Job> JobStore::job(const std::string& id) const {
  std::lock_guard lk(mu_);
  auto* j = const_cast<JobStore*>(this)->find_locked(id);
  if (!j) return std::nullopt;
  return *j;
}

bool JobStore::settled(const std::string& id) const {
  std::lock_guard lk(mu_);
  auto* j = const_cast<JobStore*>(this)->find_locked(id);
  return !j || !j->running() || j->input.has_value();
}

Outcome JobStore::answer_input(const std::string& id, const AgentRef& agent, const std::string& value,
                               const std::function<void(ClientMessage)>& send) {
  Outcome out;
  out.job = id;
  {
    std::lock_guard lk(mu_);
    Job* j = find_locked(id);
    if (!j) {
      out.refusal = Refusal::no_such_job;
      out.message = "No such job '" + id + "'.";
      return out;
    }
    if (!j->running() || !j->input) {
      out.refusal = Refusal::no_input_request;
      out.message = id + " is not waiting for input (" + std::string(status_name(j->status)) + ").";
      return out;
    }
    if (j->agent != agent.agent) {
      out.refusal = Refusal::not_owner;
      out.message = id + " is not yours: only the agent that ran it answers its input().";
      return out;
    }
    ClientMessage cm;
    cm.channel = Channel::stdin_;
    cm.msg_type = "input_reply";
    json header = make_header("input_reply", session_);
    cm.msg_id = header["msg_id"].get<std::string>();
    cm.route = std::string(kAgentRoute);
    cm.wire.header = header.dump();
    cm.wire.parent_header = j->input->header;
    cm.wire.metadata = "{}";
    cm.wire.content = json{{"value", value}}.dump();
    j->input.reset();
    changed_locked();
    send(std::move(cm));
  }
  notify();
  return out;
}

bool JobStore::is_running(const std::string& id) const {
  std::lock_guard lk(mu_);
  auto* j = const_cast<JobStore*>(this)->find_locked(id);
  return j && j->running();
}

JobStore::Listing JobStore::list(const std::string& kernel, std::uint64_t after, std::size_t code_chars) const {
  Listing out;
  std::lock_guard lk(mu_);
  out.version = version_;
  for (auto it = jobs_.upper_bound(after); it != jobs_.end(); ++it) {
    const Job& j = it->second;
    if (!kernel.empty() && j.kernel != kernel) continue;
    Job s;
    s.n = j.n;
    s.kernel = j.kernel;
    s.origin = j.origin;
    s.agent = j.agent;
    s.label = j.label;
    s.request = j.request;
    std::size_t keep = utf8_head(j.code, code_chars);
    s.code = j.code.substr(0, keep);
    s.code_cut = j.code_cut + (j.code.size() - keep);
    s.status = j.status;
    s.began = j.began;
    s.created = j.created;
    s.began_at = j.began_at;
    s.ended_at = j.ended_at;
    s.t_created = j.t_created;
    s.t_began = j.t_began;
    s.t_ended = j.t_ended;
    s.execution_count = j.execution_count;
    s.ename = j.ename;
    s.note = j.note;
    s.seen_by_agent = j.seen_by_agent;
    s.released = j.released;
    s.generation = j.generation;
    s.task = j.task;
    out.jobs.push_back(std::move(s));
  }
  for (auto& r : marks_)
    if (kernel.empty() || r.kernel == kernel) out.restarts.push_back(r);
  return out;
}

std::vector<Job> JobStore::kernel_jobs(const std::string& kernel) const {
  std::lock_guard lk(mu_);
  std::vector<Job> out;
  for (auto& [n, j] : jobs_)
    if (j.kernel == kernel) out.push_back(j);
  return out;
}

std::vector<RestartMark> JobStore::restarts(const std::string& kernel) const {
  std::lock_guard lk(mu_);
  std::vector<RestartMark> out;
  for (auto& r : marks_)
    if (r.kernel == kernel) out.push_back(r);
  return out;
}

Digest JobStore::digest(const std::string& kernel) const {
  std::lock_guard lk(mu_);
  Digest d;
  auto now = Clock::now();
  for (auto& [n, j] : jobs_)
    if (j.kernel == kernel && !j.seen_by_agent)
      d.jobs.push_back(DigestEntry{j.id(), j.status, j.origin, j.elapsed(now)});
  if (auto it = kernels_.find(kernel); it != kernels_.end()) d.evicted_unseen = it->second.evicted_unseen;
  return d;
}

AckResult JobStore::ack(const std::string& kernel, const AgentRef& agent, const std::vector<std::string>& ids) {
  AckResult r;
  {
    std::lock_guard lk(mu_);
    auto now = Clock::now();
    auto& ag = agents_[agent.agent];
    ag.last_seen = now;
    ag.exited = false;
    auto& pk = kernels_[kernel];
    if (pk.claim && pk.claim->agent != agent.agent && alive_locked(pk.claim->agent, now)) {
      r.outcome.refusal = Refusal::not_owner;
      r.outcome.holder = claim_view_locked(*pk.claim, now);
      r.outcome.message = "Only the kernel's holder, " + holder_text(*r.outcome.holder) +
                          ", may acknowledge its digest.";
      return r;
    }
    for (auto& id : ids) {
      Job* j = find_locked(id);
      if (!j || j->kernel != kernel) {
        r.kept.emplace_back(id, "no such job on this kernel");
      } else if (j->running()) {
        r.kept.emplace_back(id, "still running: it is reported again once it has ended");
      } else {
        if (!j->seen_by_agent) {
          j->seen_by_agent = true;
          --unseen_;
          evictable_.insert(j->n);
          changed_locked();
          dirty_locked(*j);
        }
        r.acked.push_back(id);
      }
    }
    if (jobs_.size() > limits_.max_jobs) enforce_locked();
    pk.evicted_unseen = 0;
  }
  notify();
  return r;
}

KernelRecordInfo JobStore::kernel_info(const std::string& kernel) const {
  std::lock_guard lk(mu_);
  KernelRecordInfo info;
  auto now = Clock::now();
  if (auto it = kernels_.find(kernel); it != kernels_.end()) {
    if (it->second.claim) info.claim = claim_view_locked(*it->second.claim, now);
    info.restarts = it->second.restarts;
  }
  if (auto* j = const_cast<JobStore*>(this)->running_locked(kernel)) info.running_job = j->id();
  return info;
}

std::uint64_t JobStore::version() const {
  std::lock_guard lk(mu_);
  return version_;
}

std::size_t JobStore::bytes() const {
  std::lock_guard lk(mu_);
  return bytes_;
}

JobStats JobStore::stats() const {
  std::lock_guard lk(mu_);
  JobStats s = stats_;
  s.jobs = jobs_.size();
  s.bytes = bytes_;
  return s;
}

// ---------------------------------------------------------------------------------------
// JobStore: records on disk (DEV.md §4e)
//
// A kernel's log holds three kinds of line, and the last line of a job wins:
//   {"t": "job", "n": N, ...}        a job as it is now (written when it is created, begins and
//                                     ends, when an agent acknowledges it, and every few seconds
//                                     while its output grows);
//   {"t": "restart", "after_job": N, "at": ..., "reason": ...}   a restart mark;
//   {"t": "kernel", "generation": G, "restarts": R, "last_count": C, "claim": {...} | null}.
// A log is compacted (rewritten with one line per live job) once it is twice its size after
// the last compaction plus kCompactSlack.

namespace {

constexpr std::uint64_t kCompactSlack = 1u << 20;

std::int64_t unix_ms(std::chrono::steady_clock::time_point t) {
  using namespace std::chrono;
  auto sys = system_clock::now() - duration_cast<system_clock::duration>(steady_clock::now() - t);
  return duration_cast<milliseconds>(sys.time_since_epoch()).count();
}

std::chrono::steady_clock::time_point steady_of(std::int64_t ms) {
  using namespace std::chrono;
  auto ago = system_clock::now() - system_clock::time_point(duration_cast<system_clock::duration>(milliseconds(ms)));
  return steady_clock::now() - duration_cast<steady_clock::duration>(ago);
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json record_line(const Job& j) {
  json l = {{"t", "job"},
            {"n", j.n},
            {"origin", origin_name(j.origin)},
            {"agent", j.agent},
            {"label", j.label},
            {"request", j.request},
            {"code", j.code},
            {"code_cut", j.code_cut},
            {"status", status_name(j.status)},
            {"began", j.began},
            {"created", j.created},
            {"began_at", j.began_at},
            {"ended_at", j.ended_at},
            {"created_ms", unix_ms(j.t_created)},
            {"logged_ms", unix_ms(std::chrono::steady_clock::now())},
            {"output", j.output.text()},
            {"output_total", j.output.total()},
            {"result", j.result.text()},
            {"result_total", j.result.total()},
            {"ename", j.ename},
            {"evalue", j.evalue},
            {"traceback", j.traceback},
            {"note", j.note},
            {"stop_note", j.stop_note},
            {"seen", j.seen_by_agent},
            {"released", j.released},
            {"reply_status", j.reply_status},
            {"generation", j.generation},
            {"task", j.task}};
  if (j.began) l["began_ms"] = unix_ms(j.t_began);
  if (!j.running()) l["ended_ms"] = unix_ms(j.t_ended);
  if (j.execution_count) l["execution_count"] = *j.execution_count;
  return l;
}

template <class E, class F>
std::optional<E> named(const std::string& name, F name_of, std::initializer_list<E> all) {
  for (E e : all)
    if (name_of(e) == name) return e;
  return std::nullopt;
}

// A job read back from its line; throws json::exception (or std::runtime_error) on a bad one.
Job job_from_record(const json& l, const std::string& kernel, const RecordLimits& limits) {
  Job j;
  j.n = l.at("n").get<std::uint64_t>();
  if (j.n == 0) throw std::runtime_error("job number 0");
  j.kernel = kernel;
  auto origin = named(l.at("origin").get<std::string>(), origin_name, {JobOrigin::mcp, JobOrigin::user, JobOrigin::host});
  auto status = named(l.at("status").get<std::string>(), status_name,
                      {JobStatus::running, JobStatus::ok, JobStatus::error, JobStatus::interrupted, JobStatus::aborted,
                       JobStatus::kernel_lost, JobStatus::end_not_recorded, JobStatus::culled});
  if (!origin || !status) throw std::runtime_error("an unknown origin or status");
  j.origin = *origin;
  j.status = *status;
  j.agent = l.value("agent", "");
  j.label = l.value("label", "");
  j.request = l.value("request", "");
  j.code = l.value("code", "");
  j.code_cut = l.value("code_cut", std::size_t{0});
  j.began = l.value("began", false);
  j.created = l.value("created", "");
  j.began_at = l.value("began_at", "");
  j.ended_at = l.value("ended_at", "");
  j.t_created = steady_of(l.at("created_ms").get<std::int64_t>());
  j.t_began = l.contains("began_ms") ? steady_of(l["began_ms"].get<std::int64_t>()) : j.t_created;
  j.t_ended = l.contains("ended_ms") ? steady_of(l["ended_ms"].get<std::int64_t>()) : j.t_began;
  if (l.contains("execution_count")) j.execution_count = l["execution_count"].get<int>();
  j.output = TailText(limits.job_output_bytes);
  j.output.restore(l.value("output", ""), l.value("output_total", std::size_t{0}));
  j.result = TailText(limits.job_output_bytes);
  j.result.restore(l.value("result", ""), l.value("result_total", std::size_t{0}));
  j.ename = l.value("ename", "");
  j.evalue = l.value("evalue", "");
  if (auto tb = l.find("traceback"); tb != l.end() && tb->is_array())
    for (auto& line : *tb)
      if (line.is_string()) j.traceback.push_back(line.get<std::string>());
  j.note = l.value("note", "");
  j.stop_note = l.value("stop_note", "");
  j.task = l.value("task", false);
  j.seen_by_agent = l.value("seen", j.origin != JobOrigin::user);
  j.released = l.value("released", false);
  j.reply_status = l.value("reply_status", "");
  j.generation = l.value("generation", std::uint64_t{0});
  j.logged_total = j.output.total();
  j.logged_at = std::chrono::steady_clock::now();
  return j;
}

}  // namespace

std::string JobStore::kernel_line_locked(const std::string&, const PerKernel& pk) const {
  json l = {{"t", "kernel"}, {"generation", pk.generation}, {"restarts", pk.restarts}, {"last_count", pk.last_count}};
  l["claim"] = pk.claim ? json{{"agent", pk.claim->agent}, {"label", pk.claim->label}} : json(nullptr);
  return dump(l);
}

void JobStore::persist_locked() {
  if (!log_ || (dirty_.empty() && dirty_kernels_.empty() && pending_lines_.empty())) return;
  std::set<std::string> touched;
  for (auto& [kernel, line] : pending_lines_)
    if (kernels_.count(kernel) && log_->append(kernel, line)) touched.insert(kernel);
  pending_lines_.clear();
  const auto now = Clock::now();
  for (auto n : dirty_) {
    auto it = jobs_.find(n);
    if (it == jobs_.end() || !kernels_.count(it->second.kernel)) continue;  // evicted, or its kernel is gone
    Job& j = it->second;
    j.logged_total = j.output.total();
    j.logged_at = now;
    if (log_->append(j.kernel, dump(record_line(j)))) touched.insert(j.kernel);
  }
  dirty_.clear();
  for (const auto& k : dirty_kernels_)
    if (auto it = kernels_.find(k); it != kernels_.end() && log_->append(k, kernel_line_locked(k, it->second)))
      touched.insert(k);
  dirty_kernels_.clear();
  for (const auto& k : touched) {
    auto& pk = kernels_.at(k);
    if (log_->size(k) > 2 * pk.log_base + kCompactSlack) compact_locked(k, pk);
  }
}

void JobStore::compact_locked(const std::string& kernel, PerKernel& pk) {
  std::vector<std::string> lines;
  lines.push_back(kernel_line_locked(kernel, pk));
  for (const auto& m : marks_)
    if (m.kernel == kernel)
      lines.push_back(dump(json{{"t", "restart"}, {"after_job", m.after_job}, {"at", m.at}, {"reason", m.reason}}));
  const auto now = Clock::now();
  for (auto& [n, j] : jobs_)
    if (j.kernel == kernel) {
      j.logged_total = j.output.total();
      j.logged_at = now;
      lines.push_back(dump(record_line(j)));
    }
  if (log_->rewrite(kernel, lines)) pk.log_base = log_->size(kernel);
  log_->save_counter(counter_);
}

std::vector<std::string> JobStore::restore(RecordLog::Loaded loaded) {
  std::vector<std::string> out;
  for (auto& p : loaded.problems) out.push_back("records: " + p);
  if (!log_ || !limits_.enabled) return out;
  {
    std::lock_guard lk(mu_);
    counter_ = std::max(counter_, loaded.counter);
    const std::string back = iso_now();
    const auto now = Clock::now();
    for (auto& [kernel, lines] : loaded.logs) {
      auto& pk = kernels_[kernel];
      pk.restored = true;
      pk.back_at = back;
      std::map<std::uint64_t, json> latest;
      std::size_t bad = 0, running = 0, jobs = 0;
      std::int64_t last_ms = 0;
      for (auto& line : lines) {
        json l = json::parse(line, nullptr, false);
        const std::string t = l.is_object() ? str_value(l, "t") : "";
        try {
          if (t == "job") {
            last_ms = std::max(last_ms, l.value("logged_ms", std::int64_t{0}));
            auto n = l.at("n").get<std::uint64_t>();
            latest[n] = std::move(l);
          } else if (t == "restart") {
            marks_.push_back(RestartMark{kernel, l.at("after_job").get<std::uint64_t>(), str_value(l, "at"),
                                         str_value(l, "reason")});
          } else if (t == "kernel") {
            pk.generation = l.value("generation", std::uint64_t{0});
            pk.restarts = l.value("restarts", std::uint64_t{0});
            pk.last_count = std::max(pk.last_count, l.value("last_count", 0));
            auto c = l.find("claim");
            if (c != l.end() && c->is_object()) {
              pk.claim = AgentRef{c->value("agent", ""), c->value("label", "")};
              if (pk.claim->agent.empty()) pk.claim.reset();
            } else {
              pk.claim.reset();
            }
          } else {
            ++bad;  // not JSON, or a kind of line a newer kgate writes
          }
        } catch (const std::exception&) {
          ++bad;
        }
      }
      std::string away = last_ms ? iso_time(std::chrono::system_clock::time_point(std::chrono::milliseconds(last_ms)))
                                 : std::string("an unknown time");
      pk.away_from = away;
      for (auto& [n, l] : latest) {
        Job j;
        try {
          j = job_from_record(l, kernel, limits_);
        } catch (const std::exception&) {
          ++bad;
          continue;
        }
        counter_ = std::max(counter_, j.n);
        if (j.execution_count && j.generation == pk.generation) pk.last_count = std::max(pk.last_count, *j.execution_count);
        if (!j.seen_by_agent) ++unseen_;
        if (j.running()) {
          ++running;
          j.gap = true;
          j.note += std::string(j.note.empty() ? "" : " ") + "kgate was away while this job ran: its records were last "
                    "written at " + away + " and read back at " + back + "; output printed between the two was not heard.";
          if (!j.request.empty()) by_request_[j.request] = j.n;
          running_.insert(j.n);
        } else if (j.seen_by_agent || j.origin != JobOrigin::user) {
          evictable_.insert(j.n);
        }
        bytes_ += j.bytes();
        ++jobs;
        jobs_.insert_or_assign(n, std::move(j));
      }
      if (pk.claim) {
        // Its agent gets the grace of a dropped connection to come back (kgate-mcp reconnects).
        auto& a = agents_[pk.claim->agent];
        a.label = pk.claim->label;
        a.ever_connected = true;
        a.last_seen = now;
      }
      out.push_back("kernel " + kernel + ": " + std::to_string(jobs) + " job record" + (jobs == 1 ? "" : "s") +
                    " read back" + (running ? " (" + std::to_string(running) + " still running)" : "") +
                    (bad ? "; " + std::to_string(bad) + " unreadable line" + (bad == 1 ? "" : "s") + " skipped" : ""));
    }
    std::stable_sort(marks_.begin(), marks_.end(),
                     [](const RestartMark& a, const RestartMark& b) { return a.after_job < b.after_job; });
    if (marks_.size() > limits_.max_restart_marks)
      marks_.erase(marks_.begin(), marks_.end() - static_cast<std::ptrdiff_t>(limits_.max_restart_marks));
    enforce_locked();
    for (auto& [kernel, _] : loaded.logs) compact_locked(kernel, kernels_[kernel]);  // drops torn and stale lines
    changed_locked();
  }
  notify();
  return out;
}

void JobStore::lost_while_away(const std::string& kernel, const std::string& reason) {
  if (!limits_.enabled) return;
  {
    std::lock_guard lk(mu_);
    lose_running_locked(kernel, JobStatus::kernel_lost, "The kernel stopped before this job finished: " + reason + ".");
    if (auto it = kernels_.find(kernel); it != kernels_.end()) it->second.restored = false;
    changed_locked();
  }
  notify();
}

void JobStore::on_kernel_readopted(const KernelPtr& kernel, const std::string& history_reply) {
  if (!limits_.enabled) return;
  json content = parse_part(history_reply);
  std::size_t added = 0;
  {
    std::lock_guard lk(mu_);
    auto pit = kernels_.find(kernel->id());
    if (pit == kernels_.end() || !pit->second.restored) return;  // no records of it were read back
    PerKernel& pk = pit->second;
    pk.restored = false;
    const auto now = Clock::now();
    // The shell answered, so the cell that ran at the gap has ended: unless its idle is heard
    // (it races the reply across two sockets), it ended while kgate was away.
    std::vector<Job*> gap_jobs;
    for (auto n : running_) {
      Job& j = jobs_.at(n);
      if (j.kernel != kernel->id() || !j.gap || j.task) continue;  // a task's end: the kernel side says
      j.gap_end_at = now + std::chrono::seconds(1);
      gap_jobs.push_back(&j);
    }
    // The history: [session, line, input] or [session, line, [input, output]] per cell.
    std::map<int, std::pair<std::string, std::optional<std::string>>> cells;
    if (auto h = content.is_object() ? content.find("history") : content.end(); h != content.end() && h->is_array())
      for (auto& e : *h) {
        if (!e.is_array() || e.size() < 3 || !e[1].is_number_integer()) continue;
        int line = e[1].get<int>();
        if (line <= pk.last_count) continue;
        const json& io = e[2];
        if (io.is_string()) {
          cells[line] = {io.get<std::string>(), std::nullopt};
        } else if (io.is_array() && io.size() == 2 && io[0].is_string()) {
          cells[line] = {io[0].get<std::string>(),
                         io[1].is_string() ? std::optional<std::string>(io[1].get<std::string>()) : std::nullopt};
        }
      }
    const std::string note = "It ran while kgate was away (between " + pk.away_from + " and " + pk.back_at +
                             "), from a client holding the connection file. It is recovered from the kernel's "
                             "history, which keeps its code and result but not its output or its status.";
    for (auto& [number, cell] : cells) {
      const int line = number;  // a lambda may not capture a structured binding (clang 14)
      pk.last_count = std::max(pk.last_count, line);
      auto same = std::find_if(gap_jobs.begin(), gap_jobs.end(),
                               [&](Job* j) { return j->execution_count && *j->execution_count == line; });
      if (same != gap_jobs.end()) {  // the cell that ran at the gap: its result, if it had one
        if (cell.second && (*same)->result.total() == 0) {
          std::size_t before = (*same)->bytes();
          append_valid((*same)->result, *cell.second);
          add_bytes(before, **same);
        }
        continue;
      }
      if (cell.first.empty()) continue;
      Job& j = create_locked(kernel->id(), JobOrigin::user, {}, cell.first);
      std::size_t before = j.bytes();
      j.began = true;
      j.t_began = j.t_ended = now;
      j.execution_count = line;
      if (cell.second) append_valid(j.result, *cell.second);
      j.status = JobStatus::end_not_recorded;
      j.ended_at = iso_now();
      j.note = note;
      add_bytes(before, j);
      finished_locked(j);
      ++added;
    }
    dirty_kernel_locked(kernel->id());
    changed_locked();
    if (jobs_.size() > limits_.max_jobs || bytes_ > limits_.budget_bytes) enforce_locked();
  }
  if (added)
    spdlog::info("kernel {}: {} cell{} ran while kgate was away; recorded from the kernel's history", kernel->id(),
                 added, added == 1 ? "" : "s");
  notify();
}

// ---------------------------------------------------------------------------------------
// Rendering

json job_json(const Job& j, bool full, std::chrono::steady_clock::time_point now) {
  auto opt = [](const std::string& s) { return s.empty() ? json(nullptr) : json(s); };
  json o = {{"job", j.id()},
            {"kernel", j.kernel},
            {"request", opt(j.request)},
            {"origin", origin_name(j.origin)},
            {"agent", opt(j.agent)},
            {"label", opt(j.label)},
            {"status", status_name(j.status)},
            {"began", j.began},
            {"created", j.created},
            {"began_at", opt(j.began_at)},
            {"ended_at", opt(j.ended_at)},
            {"elapsed", std::round(j.elapsed(now) * 1000.0) / 1000.0},
            {"execution_count", j.execution_count ? json(*j.execution_count) : json(nullptr)},
            {"code", j.code},
            {"code_cut", j.code_cut},
            {"note", j.note},
            {"task", j.task},
            {"seen_by_agent", j.seen_by_agent}};
  if (j.input) o["input_request"] = {{"prompt", j.input->prompt}, {"password", j.input->password}};
  if (full) {
    o["output"] = std::string(j.output.text());
    o["output_cut"] = j.output.cut();
    o["result"] = std::string(j.result.text());
    o["result_cut"] = j.result.cut();
    if (j.ename.empty())
      o["error"] = nullptr;
    else
      o["error"] = {{"ename", j.ename}, {"evalue", j.evalue}, {"traceback", j.traceback}};
  } else {
    o["ename"] = opt(j.ename);
  }
  return o;
}

json notebook_json(const std::vector<Job>& jobs, const std::vector<RestartMark>& marks,
                   const KernelSpec* spec) {
  auto lines = [](const std::string& text) {
    json arr = json::array();
    std::size_t i = 0;
    while (i < text.size()) {
      auto nl = text.find('\n', i);
      std::size_t end = nl == std::string::npos ? text.size() : nl + 1;
      arr.push_back(text.substr(i, end - i));
      i = end;
    }
    return arr;
  };
  json cells = json::array();
  auto now = std::chrono::steady_clock::now();
  std::size_t mark = 0;
  auto restart_cell = [&](const RestartMark& r) {
    cells.push_back({{"cell_type", "markdown"},
                     {"id", "restart-after-job-" + std::to_string(r.after_job) + "-" + std::to_string(mark)},
                     {"metadata", json::object()},
                     {"source", lines("**Kernel restarted** at " + r.at + " (" + r.reason +
                                      "). The cells above ran in a namespace that is gone; the cells "
                                      "below do not see their variables.")}});
  };
  for (const Job& j : jobs) {
    while (mark < marks.size() && marks[mark].after_job < j.n) restart_cell(marks[mark++]);
    std::ostringstream head;
    head << "# [" << j.id() << " · " << origin_name(j.origin) << " · " << status_name(j.status) << " · "
         << std::fixed << std::setprecision(2) << j.elapsed(now) << " s · " << j.created << "]\n";
    json outputs = json::array();
    if (!j.output.text().empty() || j.output.cut()) {
      std::string text(j.output.text());
      if (j.output.cut()) text = "[" + std::to_string(j.output.cut()) + " earlier bytes cut]\n" + text;
      outputs.push_back({{"output_type", "stream"}, {"name", "stdout"}, {"text", lines(text)}});
    }
    if (!j.result.text().empty())
      outputs.push_back({{"output_type", "execute_result"},
                         {"execution_count", j.execution_count ? json(*j.execution_count) : json(nullptr)},
                         {"data", {{"text/plain", lines(std::string(j.result.text()))}}},
                         {"metadata", json::object()}});
    if (!j.ename.empty())
      outputs.push_back({{"output_type", "error"}, {"ename", j.ename}, {"evalue", j.evalue}, {"traceback", j.traceback}});
    if (!j.note.empty())
      outputs.push_back({{"output_type", "stream"}, {"name", "stderr"}, {"text", lines(j.note + "\n")}});
    cells.push_back({{"cell_type", "code"},
                     {"id", j.id()},
                     {"execution_count", j.execution_count ? json(*j.execution_count) : json(nullptr)},
                     {"metadata",
                      {{"kgate",
                        {{"job", j.id()}, {"origin", origin_name(j.origin)}, {"status", status_name(j.status)},
                         {"elapsed", std::round(j.elapsed(now) * 1000.0) / 1000.0}, {"created", j.created}}}}},
                     {"source", lines(head.str() + j.code)},
                     {"outputs", outputs}});
  }
  while (mark < marks.size()) restart_cell(marks[mark++]);
  json meta = json::object();
  if (spec) {
    meta["kernelspec"] = {{"name", spec->name}, {"display_name", spec->display_name},
                          {"language", spec->language}};
    meta["language_info"] = {{"name", spec->language}};
  }
  return {{"nbformat", 4}, {"nbformat_minor", 5}, {"metadata", meta}, {"cells", cells}};
}

}  // namespace kgate
