// ConnectionGate (connection_gate.hpp): the open and the unauthenticated connections, bounded.
#include "http/connection_gate.hpp"

#include <utility>

namespace kgate::gw {

ConnectionGate::Slot::~Slot() {
  if (gate_) gate_->release(*this);
}

void ConnectionGate::Slot::authenticated() {
  if (authenticated_ || !gate_) return;
  authenticated_ = true;
  gate_->waiting_.erase(pos_);
  close_ = nullptr;  // never evicted: nothing of the session need be held
}

void ConnectionGate::release(Slot& s) {
  if (!s.authenticated_) waiting_.erase(s.pos_);
  s.gate_ = nullptr;
  --open_;
}

bool ConnectionGate::evict_oldest() {
  if (waiting_.empty()) return false;
  Slot* oldest = waiting_.front();
  release(*oldest);  // its place is free now, whenever its session ends
  ++evicted_;
  if (auto close = std::exchange(oldest->close_, nullptr)) close();
  return true;
}

std::shared_ptr<ConnectionGate::Slot> ConnectionGate::admit(std::function<void()> close) {
  if (waiting_.size() >= max_unauthenticated_) evict_oldest();
  if (open_ >= max_open_ && !evict_oldest()) return nullptr;
  std::shared_ptr<Slot> s(new Slot(*this, std::move(close)));
  ++open_;
  s->pos_ = waiting_.insert(waiting_.end(), s.get());
  return s;
}

}  // namespace kgate::gw
