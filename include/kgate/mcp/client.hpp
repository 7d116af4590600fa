// The gateway client (kgate_client, include/kgate/client/) as the translator uses it: its names
// in kgate::mcp, so the tools read as before the client had a library of its own.
#pragma once

#include "kgate/client/agent_link.hpp"
#include "kgate/client/endpoint.hpp"
#include "kgate/client/gateways_toml.hpp"
#include "kgate/client/http_client.hpp"
#include "kgate/client/kernel_channel.hpp"
#include "kgate/client/listing.hpp"
#include "kgate/client/outputs.hpp"

namespace kgate::mcp {

using client::AgentLink;
using client::CellOutput;
using client::Config;
using client::Endpoint;
using client::GatewayEntry;
using client::HttpClient;
using client::HttpResult;
using client::KernelChannel;
using client::known_gateways_hint;
using client::list_remote;
using client::load_config;
using client::output_from_iopub;
using client::outputs_from_record;
using client::parse_endpoint_url;
using client::parse_gateways;
using client::RemoteKernel;
using client::RemoteListing;
using client::RemoteOptions;
using client::RenderMarks;
using client::render_json;
using client::render_text;
using client::resolve_gateway;

}  // namespace kgate::mcp
