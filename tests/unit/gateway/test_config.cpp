// Unit tests for kgate.toml loading: the shipped sample, every kind of error, token_file.
#include "config.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>

#include "support.hpp"

namespace kgate::gw {
namespace {

namespace fs = std::filesystem;

// <source>/tests/data -> <source>
const fs::path kSourceDir = kgate::test::data_dir().parent_path().parent_path();

// A kgate-config-XXXXXX temp dir that also writes files into itself.
class ConfigDir : public test::TempDir {
 public:
  ConfigDir() : TempDir("kgate-config") {}

  // Writes <dir>/<name> with `text` and returns its path.
  fs::path write(const std::string& name, std::string_view text) const {
    const fs::path p = path() / name;
    test::write_file(p, text);
    return p;
  }
};

// Compares every field of GatewayOptions (and its KernelOptions), one expectation each.
void expect_same_options(const GatewayOptions& a, const GatewayOptions& b) {
#define KGATE_SAME(field) EXPECT_EQ(a.field, b.field) << #field
#define KGATE_SAME_COUNT(field) EXPECT_EQ(a.field.count(), b.field.count()) << #field
  KGATE_SAME(ip);
  KGATE_SAME(port);
  KGATE_SAME(token);
  KGATE_SAME(base_url);
  KGATE_SAME(runtime_dir);
  KGATE_SAME(root_dir);
  KGATE_SAME(default_kernel);
  KGATE_SAME(allow_origins);
  KGATE_SAME(allow_hosts);
  EXPECT_EQ(int(a.env_policy), int(b.env_policy)) << "env_policy";
  KGATE_SAME(env_allow);
  KGATE_SAME(max_body_bytes);
  KGATE_SAME(max_header_bytes);
  KGATE_SAME(max_ws_message_bytes);
  KGATE_SAME(client_queue_bytes);
  KGATE_SAME(client_queue_messages);
  KGATE_SAME(replay_bytes);
  KGATE_SAME(replay_messages);
  KGATE_SAME_COUNT(replay_ttl);
  KGATE_SAME_COUNT(sessionless_window);
  KGATE_SAME(max_detached_sessions);
  KGATE_SAME_COUNT(kernel.ready_timeout);
  KGATE_SAME_COUNT(kernel.shutdown_grace);
  KGATE_SAME_COUNT(kernel.terminate_grace);
  KGATE_SAME_COUNT(kernel.heartbeat_interval);
  KGATE_SAME(kernel.heartbeat_misses);
  KGATE_SAME_COUNT(kernel.iopub_batch);
  KGATE_SAME(kernel.launch_attempts);
  KGATE_SAME(kernel.max_pending);
  KGATE_SAME(kernel.max_held);
  KGATE_SAME(kernel.max_message_bytes);
  KGATE_SAME(max_waiters);
  KGATE_SAME(records.enabled);
  KGATE_SAME(records.max_jobs);
  KGATE_SAME(records.job_output_bytes);
  KGATE_SAME(records.job_code_bytes);
  KGATE_SAME(records.budget_bytes);
  KGATE_SAME(records.max_unseen_jobs);
  KGATE_SAME_COUNT(records.claim_grace);
  KGATE_SAME_COUNT(records.reply_grace);
  KGATE_SAME(max_kernels);
  KGATE_SAME(kernel.registration_ip);
  KGATE_SAME(kernel.registration_port);
  KGATE_SAME_COUNT(kernel.registration_timeout);
  KGATE_SAME_COUNT(kernel.link_timeout);
  KGATE_SAME_COUNT(kernel.scheduler_poll);
  KGATE_SAME(launchers.size());
  KGATE_SAME(pool.size);
  KGATE_SAME(pool.kernels);
#undef KGATE_SAME
#undef KGATE_SAME_COUNT
}

// Options where every field differs from its default.
GatewayOptions poisoned_options() {
  GatewayOptions o;
  o.ip = "10.9.8.7";
  o.port = 1;
  o.token = "poison";
  o.base_url = "/poison/";
  o.runtime_dir = "/poison/runtime";
  o.root_dir = "/poison/root";
  o.default_kernel = "poison";
  o.allow_origins = {"poison"};
  o.allow_hosts = {"poison"};
  o.env_policy = EnvPolicy::filtered;
  o.env_allow = {"POISON"};
  o.max_body_bytes = 1;
  o.max_header_bytes = 1;
  o.max_ws_message_bytes = 1;
  o.client_queue_bytes = 1;
  o.client_queue_messages = 1;
  o.replay_bytes = 1;
  o.replay_messages = 1;
  o.replay_ttl = std::chrono::seconds(1);
  o.sessionless_window = std::chrono::seconds(1);
  o.max_detached_sessions = 1;
  o.kernel.ready_timeout = std::chrono::milliseconds(1);
  o.kernel.shutdown_grace = std::chrono::milliseconds(1);
  o.kernel.terminate_grace = std::chrono::milliseconds(1);
  o.kernel.heartbeat_interval = std::chrono::milliseconds(1);
  o.kernel.heartbeat_misses = 1;
  o.kernel.iopub_batch = std::chrono::milliseconds(1);
  o.kernel.launch_attempts = 1;
  o.kernel.max_pending = 1;
  o.kernel.max_held = 1;
  o.kernel.max_message_bytes = 1;
  o.max_waiters = 1;
  o.records.enabled = false;
  o.records.max_jobs = 1;
  o.records.job_output_bytes = 1;
  o.records.job_code_bytes = 1;
  o.records.budget_bytes = 1;
  o.records.max_unseen_jobs = 1;
  o.records.claim_grace = std::chrono::milliseconds(1);
  o.records.reply_grace = std::chrono::milliseconds(1);
  o.max_kernels = 1;
  o.kernel.registration_ip = "10.1.1.1";
  o.kernel.registration_port = 1;
  o.kernel.registration_timeout = std::chrono::milliseconds(1);
  o.kernel.link_timeout = std::chrono::milliseconds(1);
  o.kernel.scheduler_poll = std::chrono::milliseconds(1);
  o.pool.size = 7;  // pool.kernels stays empty: the sample only shows it commented out
  return o;
}

// The message of the runtime_error load_config_file throws for a file with `text`.
struct LoadResult {
  std::string error;  // "" if it loaded
  fs::path file;
  GatewayOptions opts;
};
LoadResult load_text(const ConfigDir& dir, std::string_view text) {
  LoadResult r;
  r.file = dir.write("kgate.toml", text);
  try {
    load_config_file(r.file, r.opts);
  } catch (const std::runtime_error& e) {
    r.error = e.what();
  }
  return r;
}

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "\"" << (haystack) << "\" lacks \"" << (needle) << "\""

// Loading `text` must fail with a message naming the file and `key`.
void expect_config_error(std::string_view text, const std::string& key) {
  ConfigDir dir;
  LoadResult r;
  EXPECT_NO_FATAL_FAILURE(r = load_text(dir, text));
  SCOPED_TRACE(std::string(text));
  ASSERT_FALSE(r.error.empty()) << "loaded without error";
  EXPECT_CONTAINS(r.error, r.file.string());
  EXPECT_CONTAINS(r.error, key);
}

// ---- the shipped sample ------------------------------------------------------------------

TEST(SampleConfig, Exists) {
  EXPECT_TRUE(fs::is_regular_file(kSourceDir / "config" / "kgate.toml")) << kSourceDir;
}

// Every value the sample sets equals the built-in default.
TEST(SampleConfig, ValuesAreTheDefaults) {
  GatewayOptions loaded;
  ASSERT_NO_THROW(load_config_file(kSourceDir / "config" / "kgate.toml", loaded));
  expect_same_options(loaded, GatewayOptions{});
}

// The sample says it lists "every key with its default": loading it over non-default values
// resets every option except the ones it leaves commented out (token, runtime_dir, root_dir).
TEST(SampleConfig, SetsEveryOption) {
  GatewayOptions loaded = poisoned_options();
  ASSERT_NO_THROW(load_config_file(kSourceDir / "config" / "kgate.toml", loaded));
  GatewayOptions expected;
  const GatewayOptions poison = poisoned_options();
  expected.token = poison.token;
  expected.runtime_dir = poison.runtime_dir;
  expected.root_dir = poison.root_dir;
  expect_same_options(loaded, expected);
}

TEST(LoadConfig, EmptyFileChangesNothing) {
  ConfigDir dir;
  LoadResult r = load_text(dir, "# nothing here\n");
  EXPECT_EQ(r.error, "");
  expect_same_options(r.opts, GatewayOptions{});
}

TEST(LoadConfig, AppliesValues) {
  ConfigDir dir;
  LoadResult r = load_text(dir, R"(
[server]
ip = "0.0.0.0"
port = 0
token = "abc"
base_url = "/gw/"
runtime_dir = "/tmp/rt"
root_dir = "/srv"
default_kernel = "ir"
allow_origins = ["*"]
allow_hosts = ["box.lan", "other"]
env_policy = "filtered"
env_allow = []

[limits]
max_body_bytes = 2048
max_pending_requests = 5
max_kernel_message_bytes = 4096

[kernel]
ready_timeout_ms = 0
heartbeat_misses = 7
launch_attempts = 1
iopub_batch_ms = 0
)");
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.opts.ip, "0.0.0.0");
  EXPECT_EQ(r.opts.port, 0);
  EXPECT_EQ(r.opts.token, "abc");
  EXPECT_EQ(r.opts.base_url, "/gw/");
  EXPECT_EQ(r.opts.runtime_dir, fs::path("/tmp/rt"));
  EXPECT_EQ(r.opts.root_dir, fs::path("/srv"));
  EXPECT_EQ(r.opts.default_kernel, "ir");
  EXPECT_EQ(r.opts.allow_origins, std::vector<std::string>{"*"});
  EXPECT_EQ(r.opts.allow_hosts, (std::vector<std::string>{"box.lan", "other"}));
  EXPECT_EQ(r.opts.env_policy, EnvPolicy::filtered);
  EXPECT_TRUE(r.opts.env_allow.empty());
  EXPECT_EQ(r.opts.max_body_bytes, 2048u);
  EXPECT_EQ(r.opts.kernel.max_pending, 5u);
  EXPECT_EQ(r.opts.kernel.max_message_bytes, 4096u);
  EXPECT_EQ(r.opts.kernel.ready_timeout.count(), 0);
  EXPECT_EQ(r.opts.kernel.heartbeat_misses, 7);
  EXPECT_EQ(r.opts.kernel.iopub_batch.count(), 0);
  EXPECT_EQ(r.opts.kernel.launch_attempts, 1);
}

TEST(LoadConfig, EnvPolicyValues) {
  ConfigDir dir;
  for (auto [text, policy] : {std::pair{"auto", EnvPolicy::automatic}, std::pair{"all", EnvPolicy::all},
                              std::pair{"filtered", EnvPolicy::filtered}}) {
    LoadResult r = load_text(dir, std::string("[server]\nenv_policy = \"") + text + "\"\n");
    EXPECT_EQ(r.error, "") << text;
    EXPECT_EQ(r.opts.env_policy, policy) << text;
  }
}

TEST(LoadConfig, MissingFile) {
  ConfigDir dir;
  GatewayOptions o;
  const fs::path p = dir.path() / "nope.toml";
  try {
    load_config_file(p, o);
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_CONTAINS(e.what(), p.string());
  }
}

// ---- errors ------------------------------------------------------------------------------

TEST(ConfigErrors, UnknownSection) {
  expect_config_error("[serevr]\nport = 1\n", "serevr");
  expect_config_error("[limits]\nmax_body_bytes = 2048\n[kernels]\nlaunch_attempts = 1\n", "kernels");
}

// A misspelt section with no keys under it (yet) is still a misspelt section.
TEST(ConfigErrors, UnknownEmptySection) {
  expect_config_error("[serevr]\n", "serevr");
}

TEST(ConfigErrors, TopLevelKey) {
  expect_config_error("port = 8787\n", "port");
}

TEST(ConfigErrors, UnknownKey) {
  expect_config_error("[server]\nprot = 1\n", "server.prot");
  expect_config_error("[limits]\nmax_body = 1\n", "limits.max_body");
  expect_config_error("[kernel]\nready_timeout = 1\n", "kernel.ready_timeout");
  expect_config_error("[server.sub]\nport = 1\n", "server.sub");
}

TEST(ConfigErrors, WrongType) {
  expect_config_error("[server]\nport = \"8787\"\n", "server.port");
  expect_config_error("[server]\nip = 127\n", "server.ip");
  expect_config_error("[server]\ntoken = 5\n", "server.token");
  expect_config_error("[server]\nallow_origins = \"*\"\n", "server.allow_origins");
  expect_config_error("[server]\nallow_hosts = [1, 2]\n", "server.allow_hosts");
  expect_config_error("[server]\nenv_allow = [\"A\", 2]\n", "server.env_allow");
  expect_config_error("[server]\nenv_policy = 1\n", "server.env_policy");
  expect_config_error("[limits]\nmax_body_bytes = \"16M\"\n", "limits.max_body_bytes");
  expect_config_error("[limits]\nmax_body_bytes = 2048.5\n", "limits.max_body_bytes");
  expect_config_error("[kernel]\nheartbeat_misses = [3]\n", "kernel.heartbeat_misses");
  expect_config_error("[kernel]\nready_timeout_ms = { a = 1 }\n", "kernel.ready_timeout_ms");
  expect_config_error("server = 1\n", "server");
}

// toml++'s node::value<int64_t>() converts booleans (true -> 1, false -> 0): `port = false`
// would silently pick a random port and `heartbeat_misses = true` mean 1.
TEST(ConfigErrors, BooleanIsNotAnInteger) {
  expect_config_error("[server]\nport = true\n", "server.port");
  expect_config_error("[server]\nport = false\n", "server.port");
  expect_config_error("[limits]\nreplay_messages = false\n", "limits.replay_messages");
  expect_config_error("[kernel]\nheartbeat_misses = true\n", "kernel.heartbeat_misses");
}

// ... and integral floats (8787.0 -> 8787, 1e3 -> 1000); TOML keeps the two types apart and
// the loader says "must be an integer".
TEST(ConfigErrors, FloatIsNotAnInteger) {
  expect_config_error("[server]\nport = 8787.0\n", "server.port");
  expect_config_error("[kernel]\nready_timeout_ms = 6e4\n", "kernel.ready_timeout_ms");
}

TEST(ConfigErrors, OutOfRange) {
  expect_config_error("[server]\nport = 65536\n", "server.port");
  expect_config_error("[server]\nport = -1\n", "server.port");
  expect_config_error("[server]\nport = 9223372036854775807\n", "server.port");
  expect_config_error("[limits]\nmax_body_bytes = 10\n", "limits.max_body_bytes");
  expect_config_error("[limits]\nclient_queue_messages = 0\n", "limits.client_queue_messages");
  expect_config_error("[limits]\nreplay_ttl_seconds = -5\n", "limits.replay_ttl_seconds");
  expect_config_error("[kernel]\nheartbeat_misses = 0\n", "kernel.heartbeat_misses");
  expect_config_error("[kernel]\nlaunch_attempts = 101\n", "kernel.launch_attempts");
  expect_config_error("[kernel]\niopub_batch_ms = 1001\n", "kernel.iopub_batch_ms");
  expect_config_error("[kernel]\nshutdown_grace_ms = -1\n", "kernel.shutdown_grace_ms");
}

TEST(ConfigErrors, PortBounds) {
  ConfigDir dir;
  EXPECT_EQ(load_text(dir, "[server]\nport = 0\n").error, "");
  LoadResult r = load_text(dir, "[server]\nport = 65535\n");
  EXPECT_EQ(r.error, "");
  EXPECT_EQ(r.opts.port, 65535);
}

TEST(ConfigErrors, BadEnvPolicy) {
  expect_config_error("[server]\nenv_policy = \"everything\"\n", "server.env_policy");
  expect_config_error("[server]\nenv_policy = \"Auto\"\n", "server.env_policy");
  expect_config_error("[server]\nenv_policy = \"\"\n", "server.env_policy");
}

TEST(ConfigErrors, SyntaxErrorNamesFileAndLine) {
  ConfigDir dir;
  LoadResult r = load_text(dir, "[server]\nip = \"127.0.0.1\"\nport = = 8787\n");
  ASSERT_FALSE(r.error.empty());
  EXPECT_CONTAINS(r.error, r.file.string() + ":3:");
  r = load_text(dir, "# comment\n\n[server\nport = 1\n");
  ASSERT_FALSE(r.error.empty());
  EXPECT_CONTAINS(r.error, r.file.string() + ":3:");
  r = load_text(dir, "[server]\nip = \"unterminated\n");
  ASSERT_FALSE(r.error.empty());
  EXPECT_CONTAINS(r.error, r.file.string() + ":2:");
  // A key defined twice is a TOML error too.
  r = load_text(dir, "[server]\nport = 1\nport = 2\n");
  ASSERT_FALSE(r.error.empty());
  EXPECT_CONTAINS(r.error, r.file.string() + ":3:");
}

// ---- token_file --------------------------------------------------------------------------

TEST(TokenFile, ReadsTheFirstLine) {
  ConfigDir dir;
  const fs::path tok = dir.write("token", "s3cret\nsecond line\n");
  LoadResult r = load_text(dir, "[server]\ntoken_file = \"" + tok.string() + "\"\n");
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.opts.token, "s3cret");
}

TEST(TokenFile, WithoutTrailingNewline) {
  ConfigDir dir;
  const fs::path tok = dir.write("token", "s3cret");
  LoadResult r = load_text(dir, "[server]\ntoken_file = \"" + tok.string() + "\"\n");
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.opts.token, "s3cret");
}

TEST(TokenFile, OverridesAnEarlierToken) {
  ConfigDir dir;
  const fs::path tok = dir.write("token", "fromfile\n");
  LoadResult r = load_text(dir, "[server]\ntoken = \"inline\"\ntoken_file = \"" + tok.string() + "\"\n");
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.opts.token, "fromfile");
}

// A token file written on Windows (or by `echo` piped through a CRLF tool): the line is the
// token, not the token plus '\r' (which no client would ever send).
TEST(TokenFile, CrLfLineEnding) {
  ConfigDir dir;
  const fs::path tok = dir.write("token", "s3cret\r\n");
  LoadResult r = load_text(dir, "[server]\ntoken_file = \"" + tok.string() + "\"\n");
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.opts.token, "s3cret");
}

// A configured but empty token file must not silently turn authentication off.
TEST(TokenFile, EmptyFileIsAnError) {
  ConfigDir dir;
  const fs::path tok = dir.write("token", "");
  LoadResult r = load_text(dir, "[server]\ntoken_file = \"" + tok.string() + "\"\n");
  ASSERT_FALSE(r.error.empty()) << "loaded with token \"" << r.opts.token << "\" (authentication off)";
  EXPECT_CONTAINS(r.error, r.file.string());
  EXPECT_CONTAINS(r.error, "server.token_file");
}

TEST(TokenFile, MissingFileIsAnError) {
  ConfigDir dir;
  const std::string missing = (dir.path() / "no-such-token").string();
  ConfigDir d2;
  LoadResult r = load_text(d2, "[server]\ntoken_file = \"" + missing + "\"\n");
  ASSERT_FALSE(r.error.empty());
  EXPECT_CONTAINS(r.error, r.file.string());
  EXPECT_CONTAINS(r.error, "server.token_file");
  EXPECT_CONTAINS(r.error, missing);
}

TEST(TokenFile, WrongType) {
  expect_config_error("[server]\ntoken_file = 1\n", "server.token_file");
}

TEST(LoadConfig, Pool) {
  ConfigDir dir;
  LoadResult r = load_text(dir, "[limits]\nmax_kernels = 0\n[pool]\nsize = 0\n[pool.kernels]\npython3 = 2\nir = 0\n");
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.opts.max_kernels, 0u);
  EXPECT_EQ(r.opts.pool.size, 0u);
  EXPECT_EQ(r.opts.pool.kernels, (std::map<std::string, std::size_t>{{"python3", 2}, {"ir", 0}}));
}

TEST(LoadConfig, PoolErrors) {
  expect_config_error("[pool]\nsize = 17\n", "pool.size");
  expect_config_error("[pool]\nsize = true\n", "pool.size");
  expect_config_error("[pool]\nkernels = 3\n", "pool.kernels");
  expect_config_error("[pool.kernels]\npython3 = 2.5\n", "pool.kernels.python3");
  expect_config_error("[pool]\nsurprise = 1\n", "pool.surprise");
  // 16 each is allowed, but not 64 in all.
  expect_config_error("[pool]\nsize = 16\n[pool.kernels]\na = 16\nb = 16\nc = 16\nd = 1\n", "pool");
  expect_config_error("[limits]\nmax_kernels = -1\n", "limits.max_kernels");
}

// ---- launchers (docs/dev/remote-launchers.md) ---------------------------------------------------------------

TEST(LoadConfig, Launchers) {
  ConfigDir dir;
  LoadResult r = load_text(dir, R"(
[launchers.gpu]
kind = "slurm"
partition = "gpu"
time = "01:00:00"
cpus = 4
sbatch_args = ["--qos=x"]
allow_override = ["time", "gres"]

[launchers.box]
kind = "ssh"
host = "box.example.org"
port = 2222
user = "me"
forward = true
ssh_options = ["ProxyJump=gw"]
)");
  ASSERT_EQ(r.error, "");
  ASSERT_EQ(r.opts.launchers.size(), 2u);
  const auto& gpu = *r.opts.launchers.at("gpu");
  EXPECT_EQ(gpu.kind, LauncherConfig::Kind::slurm);
  EXPECT_EQ(gpu.slurm.at("partition"), "gpu");
  EXPECT_EQ(gpu.slurm.at("cpus"), "4");
  EXPECT_EQ(gpu.sbatch_args, std::vector<std::string>{"--qos=x"});
  EXPECT_EQ(gpu.allow_override, (std::vector<std::string>{"time", "gres"}));
  EXPECT_FALSE(gpu.kgate_path.empty());  // this kgate's own path
  const auto& box = *r.opts.launchers.at("box");
  EXPECT_EQ(box.kind, LauncherConfig::Kind::ssh);
  EXPECT_EQ(box.host, "box.example.org");
  EXPECT_EQ(box.port, 2222);
  EXPECT_TRUE(box.forward);
}

TEST(ConfigErrors, Launchers) {
  expect_config_error("[launchers.a]\npartition = \"x\"\n", "launchers.a: needs kind");
  expect_config_error("[launchers.a]\nkind = \"pbs\"\n", "launchers.a.kind");
  expect_config_error("[launchers.local]\nkind = \"slurm\"\n", "launchers.local");
  expect_config_error("[launchers.\"a b\"]\nkind = \"slurm\"\n", "launchers.a b");
  expect_config_error("[launchers.a]\nkind = \"slurm\"\nqueue = \"x\"\n", "launchers.a.queue: unknown key");
  expect_config_error("[launchers.a]\nkind = \"slurm\"\nallow_override = [\"kgate_path\"]\n", "launchers.a.allow_override");
  expect_config_error("[launchers.a]\nkind = \"slurm\"\nhost = \"h\"\n", "are for kind = \"ssh\"");
  expect_config_error("[launchers.a]\nkind = \"ssh\"\n", "needs host");
  expect_config_error("[launchers.a]\nkind = \"ssh\"\nhost = \"-oProxyCommand=x\"\n", "launchers.a.host");
  expect_config_error("[launchers.a]\nkind = \"ssh\"\nhost = \"h\"\ntime = \"1\"\n", "are for kind = \"slurm\"");
  expect_config_error("[launchers.a]\nkind = \"ssh\"\nhost = \"h\"\nbind_ip = \"any\"\n", "launchers.a.bind_ip");
  expect_config_error("[remote]\nregistration_ip = \"example.org\"\n", "remote.registration_ip");
  expect_config_error("[remote]\nlink_timeout_seconds = 1\n", "remote.link_timeout_seconds");
}

}  // namespace
}  // namespace kgate::gw
