// `kgate proxy-kernel -f CONNECTION_FILE`: a Jupyter kernel to its client (JupyterLab, Notebook,
// jupyter_client) that forwards every message to a kernel of a running kgate over kgate's
// websocket API, so a notebook attaches to the agent's kernel (docs/jupyter.md "Notebooks and JupyterLab
// on kgate's kernels", DEV.md "kgate proxy-kernel").
//
// Threading: run_proxy_kernel owns the calling thread, which owns every ZMQ socket (shell,
// control and stdin ROUTERs, the iopub XPUB, the heartbeat REP) and the routing tables; the
// gateway side runs on the Link's threads (proxy_link.hpp).
#pragma once

#include <string>

namespace kgate::gw::proxy {

struct ProxyKernelOptions {
  std::string connection_file;  // written by the client that launched us
  std::string kernel;           // --kernel, else $KGATE_PROXY_KERNEL, else chosen (choose_kernel)
  std::string url;              // --url (a URL or a gateways.toml name), else $KGATE_URL, else the default
};

// Runs until a shutdown_request, SIGTERM/SIGINT, or the death of the parent process.  Returns
// the exit status: 0, or 2 for an unusable connection file or gateway (said on stderr).
int run_proxy_kernel(const ProxyKernelOptions& opts);

}  // namespace kgate::gw::proxy
