// HttpClient's exchange over plain TCP and over a Unix socket (http_exchange.hpp).
#include "http_exchange_ops.hpp"

namespace kgate::client {

void start_exchange(beast::tcp_stream& s, tcp::resolver& resolver, Exchange& x) { start_exchange_on(s, resolver, x); }
void start_exchange(tls::UnixStream& s, tcp::resolver& resolver, Exchange& x) { start_exchange_on(s, resolver, x); }

}  // namespace kgate::client
