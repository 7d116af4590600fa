// Listing a gateway's kernelspecs, kernels and sessions: kgate or any Jupyter server, named in
// gateways.toml or by URL (`list_kernels(host)` in kgate-mcp, `kgate kernels --host`).
//
// Threading: list_remote blocks the calling thread (at most `RemoteOptions::total`); it runs each
// request on a thread of its own, so any thread may call it.  The renderers are pure.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "kgate/client/http_client.hpp"
#include "kgate/client/gateways_toml.hpp"

namespace kgate::client {

struct RemoteSpec {
  std::string name;
  std::string display_name;
  std::string language;
  bool is_default = false;
};

struct RemoteKernel {
  std::string id;
  std::string name;             // its kernelspec
  std::string execution_state;
  int connections = 0;
  std::string last_activity;
  // From kgate's GET api/kgate/kernels (only when `RemoteListing::kgate`):
  json claim;                   // {"agent", "label", "alive"} or null
  std::string running_job;      // "" when none
  double age_seconds = -1;      // since it started; -1 when the server does not say
  double idle_seconds = -1;     // since its last activity
  double cull_after_seconds = -1;  // the idle timeout in force; -1: none (or not said)
  json placement;               // kgate's "kgate_placement" (a remote launcher's kernel), or null
};

struct RemoteLauncher {         // kgate's GET api/kgate/launchers
  std::string name, kind, reason;
  bool usable = false;
};

struct RemoteSession {
  std::string id;
  std::string path;
  std::string name;
  std::string type;             // "notebook", "console", ...
  std::string kernel;           // the kernel id
};

struct RemoteError {
  std::string endpoint;         // "api/kernels"
  int status = 0;               // 0: no HTTP answer
  std::string message;          // what happened and what to do; never holds the token
};

struct RemoteListing {
  std::string url;              // the endpoint's URL
  std::string name;             // the gateways.toml name, the URL, or "" (the default gateway)
  bool kgate = false;           // kgate's extensions answered (claims, running jobs)
  bool sessions_supported = false;  // GET api/sessions answered (kgate has none: 404)
  bool specs_listed = false;    // GET api/kernelspecs answered with a catalog
  bool kernels_listed = false;  // GET api/kernels (or api/kgate/kernels) answered with a list
  std::string default_spec;
  std::vector<RemoteSpec> specs;
  std::vector<RemoteKernel> kernels;
  std::vector<RemoteSession> sessions;
  std::vector<RemoteLauncher> launchers;  // kgate's; empty for another server
  std::vector<RemoteError> errors;  // per endpoint; a 404 of api/sessions or api/kgate/ is none

  bool complete() const { return errors.empty(); }
  bool listed_anything() const { return specs_listed || kernels_listed; }
  // The errors, one line each; the same message from several endpoints is said once.
  std::string error_text() const;
};

struct RemoteOptions {
  // Each request's deadline once connected (the connect has its own 5 s); the whole listing is
  // bounded by `total` however the remote behaves.
  std::chrono::milliseconds per_request{std::chrono::seconds(5)};
  std::chrono::milliseconds total{std::chrono::seconds(15)};
};

// Fetches GET api/kernelspecs, api/kernels, api/sessions and api/kgate/kernels in parallel.
// `http` is shared with the request threads (a request that outlives `total` finishes on its own).
RemoteListing list_remote(const std::shared_ptr<HttpClient>& http, const RemoteOptions& opts = {});
RemoteListing list_remote(const Endpoint& ep, const RemoteOptions& opts = {});

struct RenderMarks {
  std::string current_kernel;   // marked "<- current"
  std::string self_agent;       // a claim by this agent reads "held by you"
};

// Where a remote kernel runs, for people: "on gpu: Slurm job 12 RUNNING on node7", "on gpu:
// Slurm job 13 PENDING (Resources)".
std::string placement_text(const json& placement);

// A compact text listing: the gateway, its kernelspecs, its kernels (state, connections, last
// activity, holder, running job, session paths) and sessions whose kernel is not listed.
// Errors are not included (see error_text).
std::string render_text(const RemoteListing& l, const RenderMarks& marks = {});
// {"url", "name", "kgate", "sessions_supported", "default_kernelspec", "kernelspecs": [...],
//  "kernels": [...], "sessions": [...], "errors": [...]}
json render_json(const RemoteListing& l);

// "known gateways: a, b (in FILE)" or "no gateways are configured (FILE does not exist)", for the
// message about an unknown name.
std::string known_gateways_hint(const Config& cfg);

// The ids of a GET api/kernels reply that `prefix` names: the one equal to it, else every id that
// starts with it (none, one, or several: the caller says which is an error, in its own words).
std::vector<std::string> kernels_matching(const json& kernels, const std::string& prefix);

}  // namespace kgate::client
