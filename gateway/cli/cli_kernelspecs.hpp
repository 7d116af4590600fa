// `kgate kernelspecs`: runs kernel discovery in this process and prints what it found.
#pragma once

namespace kgate::gw {

// Prints the table (or, with `json`, the catalog as JSON) on stdout; warnings go to stderr.
// Returns the exit status: 0, or 1 when discovery found nothing launchable.
int print_kernelspecs(bool json);

}  // namespace kgate::gw
