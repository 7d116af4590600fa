// Kernel discovery: every kernelspec in the Jupyter data directories, the kernelspecs inside
// each Python environment, and one hand-crafted kernelspec per interpreter that has ipykernel,
// merged into one catalog with a launchable/why-not verdict for each entry.
//
// Threading: discover() is a pure function of its options and the file system (it blocks on
// interpreter probes). DiscoveryService owns one background thread; its snapshot() and
// refresh() may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kgate/jupyter/kernelspec.hpp"
#include "kgate/discovery/pyenvs.hpp"

namespace kgate {

// jupyter_core's data search path + "kernels", highest priority first: $JUPYTER_PATH entries,
// the user data dir ($JUPYTER_DATA_DIR, else ${XDG_DATA_HOME:-~/.local/share}/jupyter) and the
// user site's ${PYTHONUSERBASE:-~/.local}/share/jupyter, the env
// prefix's share/jupyter ($VIRTUAL_ENV or $CONDA_PREFIX; before the user dir when
// JUPYTER_PREFER_ENV_PATH is true, or when it is unset and kgate runs inside an env the user
// owns), /usr/local/share/jupyter, /usr/share/jupyter, then $IPYTHONDIR/kernels (~/.ipython).
std::vector<std::filesystem::path> kernelspec_search_dirs(const LocatorEnv& env);

struct CatalogEntry {
  KernelSpec spec;          // as launched: a bare python argv[0] is already resolved
  std::string kind;         // "kernelspec" (data dirs), "env" (inside an env), "interpreter"
  std::string source;       // the kernel.json's directory, or the interpreter's path
  std::string env;          // the environment it belongs to ("venv myproj"), "" if none
  std::string interpreter;  // the Python that runs it, "" for other languages / unresolved
  bool launchable = true;
  std::string reason;       // why not, when !launchable ("ipykernel not installed in /x/bin/python")
};

struct Catalog {
  std::vector<CatalogEntry> entries;  // data-dir kernelspecs first, then env specs, then interpreters
  std::vector<InterpreterInfo> interpreters;  // every candidate probed, in locator order
  std::vector<std::string> warnings;  // skipped kernel.json files, failed probes: file and reason
  std::string default_name;           // the configured default if launchable, else the first launchable python
  bool probed = true;                 // false: a first, quick pass without interpreter probes
  std::chrono::system_clock::time_point made;
  std::chrono::milliseconds took{0};

  // Case-insensitive; "python" means "python3". nullptr when there is no such entry.
  const CatalogEntry* find(const std::string& name) const;
  std::size_t launchable_count() const;
};

struct DiscoveryOptions {
  LocatorEnv env = LocatorEnv::from_process();
  std::string default_kernel = "python3";
  bool interpreters = true;  // false: data-dir kernelspecs only (and no probes at all)
};

// One full discovery. Probes every interpreter candidate (cached by `prober`).
Catalog discover(const DiscoveryOptions& opts, InterpreterProber& prober);

// The whole catalog as JSON (GET /api/kgate/kernelspecs, `kgate kernelspecs --json`):
// {"default", "probed", "took_ms", "entries": [{name, display_name, language, kind, source, env,
// interpreter, launchable, reason, argv}], "interpreters": [...], "warnings": [...]}.
nlohmann::json catalog_json(const Catalog& cat);

// The daemon's catalog: discovery on a background thread, so the gateway's start is not held up.
// - start() runs a quick pass first (data-dir kernelspecs, no probes; python argv[0] resolved
//   with PATH only) so snapshot() has something at once, then the full discovery.
// - Every `watch_interval` it checks the kernelspec directories' mtimes and rediscovers when one
//   changed; every `rescan_interval` it rediscovers anyway (new environments, ipykernel
//   installed), reusing the prober's cache.
// - refresh() asks for a rediscovery now; wait_for(gen) waits for it.
class DiscoveryService {
 public:
  struct Timing {
    std::chrono::milliseconds watch_interval{2000};
    std::chrono::milliseconds rescan_interval{60000};
    std::chrono::milliseconds probe_timeout{10000};
  };
  DiscoveryService(DiscoveryOptions opts, Timing timing);
  explicit DiscoveryService(DiscoveryOptions opts) : DiscoveryService(std::move(opts), Timing{}) {}
  ~DiscoveryService();
  DiscoveryService(const DiscoveryService&) = delete;
  DiscoveryService& operator=(const DiscoveryService&) = delete;

  void start();
  void stop();

  // The newest catalog. Waits up to `bound` for the first full (probed) discovery; after that
  // it never waits. Never null after start().
  std::shared_ptr<const Catalog> snapshot(std::chrono::milliseconds bound = std::chrono::milliseconds(0));
  // Asks for a rediscovery; returns the generation that will hold its result.
  std::uint64_t refresh();
  // Waits until generation `gen` exists (or `bound` passes); returns the newest catalog.
  std::shared_ptr<const Catalog> wait_for(std::uint64_t gen, std::chrono::milliseconds bound);
  std::uint64_t generation() const;
  // The newest catalog if a full one exists, else nullptr. Never waits.
  std::shared_ptr<const Catalog> full_snapshot() const;
  // Calls `fn` once a full catalog exists: at once on this thread if it does, else later on the
  // discovery thread (or from stop(), so a waiter is never left hanging). `fn` must not block.
  void when_full(std::function<void()> fn) { when_generation(kFirstFull, std::move(fn)); }
  // The same for generation `gen` (see refresh()).
  void when_generation(std::uint64_t gen, std::function<void()> fn);
  static constexpr std::uint64_t kFirstFull = 2;  // generation 1 is the quick pass

 private:
  void run();
  std::string fingerprint() const;

  DiscoveryOptions opts_;
  Timing timing_;
  InterpreterProber prober_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<const Catalog> current_;
  std::uint64_t generation_ = 0;   // catalogs published so far
  std::uint64_t requested_ = 0;    // generation a refresh() is waiting for
  bool full_ = false;              // a probed catalog has been published
  bool stopping_ = false;
  bool running_ = false;           // a discovery is in progress
  std::vector<std::pair<std::uint64_t, std::function<void()>>> waiting_;
  std::thread thread_;
};

}  // namespace kgate
