// HttpClient's exchange over TLS (http_exchange.hpp).
#include "http_exchange_ops.hpp"

namespace kgate::client {

void start_exchange(tls::TlsStream& s, tcp::resolver& resolver, Exchange& x) { start_exchange_on(s, resolver, x); }

}  // namespace kgate::client
