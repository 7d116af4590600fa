// ConnectionGate: the open and the unauthenticated connections, bounded; the oldest stranger
// goes first, and an authenticated connection is never closed for another.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "http/connection_gate.hpp"

using kgate::gw::ConnectionGate;

namespace {

struct Conn {
  std::shared_ptr<ConnectionGate::Slot> slot;
  int closed = 0;
};

// Admits `c`, counting its closes.
bool admit(ConnectionGate& gate, Conn& c) {
  c.slot = gate.admit([&c] { ++c.closed; });
  return c.slot != nullptr;
}

}  // namespace

TEST(ConnectionGate, TheOldestUnauthenticatedConnectionMakesRoomForTheNewest) {
  ConnectionGate gate(100, 3);
  std::vector<Conn> c(5);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(admit(gate, c[i]));
  EXPECT_EQ(gate.unauthenticated(), 3u);
  ASSERT_TRUE(admit(gate, c[3]));
  EXPECT_EQ(c[0].closed, 1);
  EXPECT_EQ(c[1].closed + c[2].closed, 0);
  EXPECT_EQ(gate.unauthenticated(), 3u);
  EXPECT_EQ(gate.open(), 3u);  // the closed one's place is free at once
  c[1].slot->authenticated();  // the owner's: out of the line
  ASSERT_TRUE(admit(gate, c[4]));
  EXPECT_EQ(gate.unauthenticated(), 3u);
  EXPECT_EQ(c[1].closed, 0);
  EXPECT_EQ(c[2].closed, 0);  // 2, 3, 4 waiting; 1 authenticated
  EXPECT_EQ(gate.open(), 4u);
  EXPECT_EQ(gate.evicted(), 1u);
  c[0].slot.reset();  // an evicted session's end gives back nothing twice
  EXPECT_EQ(gate.open(), 4u);
  c[3].slot.reset();
  EXPECT_EQ(gate.open(), 3u);
  EXPECT_EQ(gate.unauthenticated(), 2u);
}

TEST(ConnectionGate, FullOfAuthenticatedConnectionsTheNewOneIsRefused) {
  ConnectionGate gate(2, 2);
  Conn a, b, c, d;
  ASSERT_TRUE(admit(gate, a));
  ASSERT_TRUE(admit(gate, b));
  b.slot->authenticated();
  ASSERT_TRUE(admit(gate, c));  // a, the stranger, goes for it
  EXPECT_EQ(a.closed, 1);
  c.slot->authenticated();
  EXPECT_FALSE(admit(gate, d));  // b and c are the owner's: none is closed
  EXPECT_EQ(b.closed + c.closed + d.closed, 0);
  EXPECT_EQ(gate.open(), 2u);
  b.slot.reset();
  EXPECT_TRUE(admit(gate, d));
}

TEST(ConnectionGate, EvictOldestForDescriptors) {
  ConnectionGate gate(10, 10);
  Conn a, b;
  EXPECT_FALSE(gate.evict_oldest());
  ASSERT_TRUE(admit(gate, a));
  ASSERT_TRUE(admit(gate, b));
  EXPECT_TRUE(gate.evict_oldest());
  EXPECT_EQ(a.closed, 1);
  EXPECT_EQ(b.closed, 0);
  b.slot->authenticated();
  EXPECT_FALSE(gate.evict_oldest());
  gate.set_limits(10, 1);
  Conn c, d;
  ASSERT_TRUE(admit(gate, c));
  ASSERT_TRUE(admit(gate, d));
  EXPECT_EQ(c.closed, 1);
}
