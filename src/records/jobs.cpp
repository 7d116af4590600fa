// Job records: every cell run in kgate's kernels, built from the protocol, kept in memory: the
// store and its recording.  The other parts of JobStore: agent_policy.cpp (the agent path and the
// reads), jobs_disk.cpp (the records on disk), export.cpp (the API's and the notebook's shapes).
#include "jobs_impl.hpp"
#include "kgate/records/jobs.hpp"
#include "kgate/kernel/kernel_side.hpp"

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

#include "kgate/jupyter/connection.hpp"
#include "kgate/jupyter/utf8.hpp"

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
bool record_stream_text(const std::string& content, TailText& out, bool* is_stderr = nullptr) {
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
  // The stream's name comes before its text (ipykernel's order); a name after it reads as stdout.
  if (is_stderr) {
    // `body` is a view of `content`, or of the reader's padded copy of it.
    const bool in_content = body.data() >= content.data() && body.data() <= content.data() + content.size();
    const char* base = in_content ? content.data() : reader->padded.data();
    *is_stderr = std::string_view(base, std::size_t(body.data() - base)).find("\"stderr\"") != std::string_view::npos;
  }
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

namespace record_text {

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
namespace {

json from_dom(simdjson::dom::element e) {
  using T = simdjson::dom::element_type;
  switch (e.type()) {
    case T::OBJECT: {
      json o = json::object();
      for (auto [key, value] : simdjson::dom::object(e)) o.emplace(std::string(key), from_dom(value));
      return o;
    }
    case T::ARRAY: {
      json a = json::array();
      for (auto v : simdjson::dom::array(e)) a.push_back(from_dom(v));
      return a;
    }
    case T::STRING: return json(std::string(std::string_view(e)));
    case T::INT64: return json(std::int64_t(e));
    case T::UINT64: return json(std::uint64_t(e));
    case T::DOUBLE: return json(double(e));
    case T::BOOL: return json(bool(e));
    case T::NULL_VALUE: return json(nullptr);
  }
  return json();
}

}  // namespace

// simdjson parses (and unescapes) a large output's strings several times faster than nlohmann:
// a 50 KB image's display_data cost kgate ~0.5 ms with json::parse.  Small parts keep one
// thread-local parser; a large one gets its own, so no thread keeps a buffer its size.
json parse_part(const std::string& text) {
  auto parse = [](const std::string& t) -> json {
    std::optional<simdjson::dom::parser> own;
    static thread_local simdjson::dom::parser reused;
    simdjson::dom::parser& p = t.size() <= kReusedParserBytes ? reused : own.emplace();
    simdjson::dom::element doc;
    if (p.parse(t).get(doc)) return json(json::value_t::discarded);
    return from_dom(doc);
  };
  json j = parse(text);
  if (j.is_discarded() && !is_valid_utf8(text)) j = parse(valid_utf8(text));
  return j;
}

// A string field's value, "" when it is absent or not a string (json::value would throw).
std::string str_value(const json& j, const char* key) {
  const std::string* s = str_field(j, key);
  return s ? *s : std::string();
}

// "1 second", "300 seconds": rounded up.
std::string seconds_text(double s) {
  long n = std::max(1L, std::lround(std::ceil(s)));
  return std::to_string(n) + (n == 1 ? " second" : " seconds");
}

}  // namespace record_text

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
                                              .count())),
      outputs_(std::make_unique<OutputStore>(limits_.outputs)) {}

void JobStore::keep_outputs_in(const std::filesystem::path& dir) {
  std::lock_guard lk(mu_);
  outputs_ = std::make_unique<OutputStore>(limits_.outputs, dir);
}

std::optional<json> JobStore::outputs(const Job& j) const {
  std::lock_guard lk(mu_);
  if (!outputs_->has(j.n)) return std::nullopt;
  json out = outputs_->nbformat(j.n, j.output.text(), j.output.cut());
  if (!j.note.empty()) out.push_back({{"output_type", "stream"}, {"name", "stderr"}, {"text", j.note + "\n"}});
  return out;
}

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
    if (t != "execute_input" && t != "stream" && t != "execute_result" && t != "error" && t != "status" &&
        t != "display_data" && t != "update_display_data" && t != "clear_output")
      return;
    {
      std::lock_guard lk(mu_);
      Job* j = by_request_locked(m.parent_msg_id);
      // Most iopub traffic is not a recorded cell's (kernel_info, comms): skip it unparsed.
      if (!j && t != "execute_input" && t != "update_display_data") return;
      if (t == "stream") {
        std::size_t before = j->bytes();
        const std::size_t from = j->output.total();
        bool is_stderr = false;
        record_stream_text(m.wire.content, j->output, &is_stderr);
        outputs_->stream(j->kernel, j->n, is_stderr, from, j->output.total());
        add_bytes(before, *j);
        if (bytes_ > limits_.budget_bytes) enforce_locked();
        return;  // output is not a lifecycle change: nothing to notify
      }
      json content = parse_part(m.wire.content);
      if (!content.is_object()) return;
      // Every output, in order (outputs.hpp); a display is only that, so its content is moved there.
      if (t == "display_data" || t == "update_display_data" || t == "clear_output") {
        outputs_->message(kernel->id(), j ? j->n : 0, t, std::move(content));
        return;
      }
      if (t == "execute_result" || t == "error") outputs_->message(kernel->id(), j->n, t, content);
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
      if ((changed_ && jobs_.size() > limits_.max_jobs) || bytes_ + outputs_->memory_bytes() > limits_.budget_bytes) enforce_locked();
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
    if ((changed_ && jobs_.size() > limits_.max_jobs) || bytes_ + outputs_->memory_bytes() > limits_.budget_bytes) enforce_locked();
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
    outputs_->drop(it->first);
    return jobs_.erase(it);
  };
  // Oldest evictable (finished, and seen or not foreign) first, while over the count or the
  // byte budget: O(log n) each, whatever sits unevictable in front.
  // Over the count alone, a kernel's last finished job stays: the request waiting on it reads it
  // first (with the records full of unseen foreign jobs, the job just ended is the only
  // evictable one).  So max_jobs may be passed by one job per kernel.  Over the byte budget
  // nothing is spared.
  // The budget counts the outputs kept in memory too (their files are bounded per kernel).
  auto held = [this] { return bytes_ + outputs_->memory_bytes(); };
  for (auto ev = evictable_.begin();
       (jobs_.size() > limits_.max_jobs || held() > limits_.budget_bytes) && ev != evictable_.end();) {
    auto it = jobs_.find(*ev);
    auto next = std::next(ev);
    if (held() <= limits_.budget_bytes) {
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
  for (auto it = jobs_.lower_bound(release_from_); it != jobs_.end() && held() > limits_.budget_bytes; ++it) {
    Job& j = it->second;
    if (j.running() || j.released) continue;
    release_from_ = it->first;
    outputs_->drop(it->first);  // its outputs go with its text (export and page show the record's note)
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

}  // namespace kgate
