// comm_stats.hpp: booking under nested scopes, sums by variable and policy.
#include "support.hpp"

TEST_CASE("CommStats books under the innermost scope and restores the outer one", "[comm_stats]") {
  px::CommStats s;
  s.add_sent(5, true);
  {
    auto a = s.scope("emb", "ShardedPS");
    s.add_sent(100, false);
    s.add_received(40, true);
    s.add_call();
    {
      auto b = s.scope("w", "RingAllReduce");
      CHECK(s.current() == px::CommStats::Key{"w", "RingAllReduce"});
      s.add_sent(7, true);
      s.add_call();
    }
    s.add_received(1, false);
  }
  s.add_call();
  CHECK(s.current() == px::CommStats::Key{"", ""});

  const px::Traffic emb = s.get("emb", "ShardedPS");
  CHECK(emb.sent_inter == 100);
  CHECK(emb.recv_intra == 40);
  CHECK(emb.recv_inter == 1);
  CHECK(emb.calls == 1);
  CHECK(s.get("w", "RingAllReduce").sent_intra == 7);
  CHECK(s.get("", "").sent() == 5);
  CHECK(s.get("", "").calls == 1);
  CHECK(s.total().sent() == 112);
  CHECK(s.total().received() == 41);
  CHECK(s.policy("ShardedPS") == emb);
  CHECK(s.variable("nothing") == px::Traffic{});
  CHECK_THAT(s.report(), Catch::Contains("emb") && Catch::Contains("ShardedPS"));

  s.reset();
  CHECK(s.total() == px::Traffic{});
}

TEST_CASE("Traffic arithmetic", "[comm_stats]") {
  px::Traffic a{1, 2, 3, 4, 5}, b{1, 1, 1, 1, 1};
  px::Traffic c = a;
  c += b;
  CHECK(c.sent() == 5);
  CHECK(c.received() == 9);
  CHECK(c - b == a);
}

TEST_CASE("a Shared scope divides a call's bytes among the variables it carries, exactly", "[comm_stats]") {
  px::CommStats s;
  {
    auto shared = s.shared("ShardedPS");
    s.add_sent(10, true);
    s.add_sent(7, false);
    s.add_received(5, true);
    s.add_received(6, false);
    s.add_call();
    shared.part("a", 1);
    shared.part("b", 2);
    shared.part("c", 0);
    shared.part("a", px::Traffic{0, 0, 0, 3, 0});  // named twice: adds up
  }
  const px::Traffic a = s.get("a", "ShardedPS"), b = s.get("b", "ShardedPS"), c = s.get("c", "ShardedPS");
  // 10 bytes in proportion 1:2:0, rounded so the shares sum to 10.
  CHECK(a.sent_intra + b.sent_intra + c.sent_intra == 10);
  CHECK(a.sent_intra == 3);
  CHECK(b.sent_intra == 7);
  CHECK(c.sent_intra == 0);
  CHECK(a.sent_inter + b.sent_inter + c.sent_inter == 7);
  CHECK(a.recv_intra + b.recv_intra + c.recv_intra == 5);
  // Received from another host: a weighs 1 + 3, b 2, c nothing.
  CHECK(a.recv_inter == 4);
  CHECK(b.recv_inter == 2);
  CHECK(c.recv_inter == 0);
  // One engine call, a call of each variable it carried.
  CHECK(a.calls == 1);
  CHECK(b.calls == 1);
  CHECK(c.calls == 1);
  CHECK(s.total().calls == 1);
  CHECK(s.total().sent() == 17);
  CHECK(s.total().received() == 11);
  CHECK(s.current() == px::CommStats::Key{"", ""});
}

TEST_CASE("a Shared scope with no weights splits evenly; nested scopes book to their own entries", "[comm_stats]") {
  px::CommStats s;
  {
    auto shared = s.shared("RingAllReduce");
    s.add_sent(5, true);
    s.add_call();
    {
      auto inner = s.scope("x", "RingAllReduce");
      s.add_sent(100, true);
      s.add_call();
    }
    {
      auto hop = s.shared("RingAllReduce");  // a Shared inside a Shared
      s.add_sent(8, true);
      s.add_call();
      hop.part("p", 1);
    }
    shared.part("p", 0);
    shared.part("q", 0);
  }
  CHECK(s.get("x", "RingAllReduce").sent() == 100);
  CHECK(s.get("p", "RingAllReduce").sent() + s.get("q", "RingAllReduce").sent() == 5 + 8);
  CHECK(s.get("p", "RingAllReduce").sent() == 2 + 8);  // floor(5 * 1/2) = 2, then the inner call's 8
  CHECK(s.get("q", "RingAllReduce").sent() == 3);
  CHECK(s.get("p", "RingAllReduce").calls == 2);
  CHECK(s.get("q", "RingAllReduce").calls == 1);
  CHECK(s.total().calls == 3);
  // No parts at all: the bytes stay under the policy, unnamed.
  {
    auto none = s.shared("AllGatherv");
    s.add_sent(4, false);
    s.add_call();
  }
  CHECK(s.get("", "AllGatherv").sent_inter == 4);
  CHECK(s.total().sent() == 117);
}
