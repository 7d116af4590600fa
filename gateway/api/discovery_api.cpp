// GET /api/kgate/kernelspecs (kgate_kernelspecs, routes.hpp): the kernel catalog with every entry's verdict (discovery.hpp).
#include "handlers.hpp"

#include "kgate/jupyter/utf8.hpp"
#include "services.hpp"

namespace kgate::gw {

namespace {

constexpr auto kRefreshWait = std::chrono::seconds(60);

Response catalog_response(Services& server, const Request& fake, const Catalog& cat) {
  json j = catalog_json(cat);
  j["generation"] = server.discovery().generation();
  return json_response(fake, http::status::ok, kgate::dump_json(j));
}

}  // namespace

void kgate_kernelspecs(Call& c) {
  Services& server = c.services;
  const Request& req = c.req;
  const std::string& query = c.query;
  Respond respond = std::move(c.respond);
  Request fake;
  fake.version(req.version());
  fake.keep_alive(req.keep_alive());
  std::string refresh = query_param(query, "refresh");
  if (refresh.empty() || refresh == "0" || refresh == "false") {
    return server.with_catalog([&server, fake, respond](std::shared_ptr<const Catalog> cat) {
      respond(catalog_response(server, fake, *cat));
    });
  }
  // A rediscovery now: answer when its catalog is out, or at kRefreshWait with the newest one.
  server.when_catalog(server.discovery().refresh(), kRefreshWait,
                      [&server, fake, respond](std::shared_ptr<const Catalog> cat) {
                        respond(catalog_response(server, fake, *cat));
                      });
}

}  // namespace kgate::gw
