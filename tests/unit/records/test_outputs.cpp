// OutputStore and BlobStore: every output of a cell in order, big values in shared files, and
// every limit answered by a note.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <fstream>
#include <string>

#include "kgate/records/outputs.hpp"
#include "../support.hpp"

namespace kgate {
namespace {

using test::TempDir;
namespace fs = std::filesystem;

json display(json data, const std::string& display_id = "") {
  json c = {{"data", std::move(data)}, {"metadata", json::object()}};
  if (!display_id.empty()) c["transient"] = {{"display_id", display_id}};
  return c;
}

TEST(OutputStore, StreamsInterleaveAndMergeAsTheyCame) {
  OutputStore s;
  // stdout "ab", stdout "cd", stderr "E", stdout "f": the job's stream text is "abcdEf".
  s.stream("k", 1, false, 0, 2);
  s.stream("k", 1, false, 2, 4);
  s.stream("k", 1, true, 4, 5);
  s.stream("k", 1, false, 5, 6);
  json out = s.nbformat(1, "abcdEf", 0);
  ASSERT_EQ(out.size(), 3u) << out.dump();
  EXPECT_EQ(out[0], json({{"output_type", "stream"}, {"name", "stdout"}, {"text", "abcd"}}));
  EXPECT_EQ(out[1]["name"], "stderr");
  EXPECT_EQ(out[1]["text"], "E");
  EXPECT_EQ(out[2]["text"], "f");
  // The record kept only the tail "Ef" (4 bytes cut): what was cut is said, not lost silently.
  out = s.nbformat(1, "Ef", 4);
  ASSERT_EQ(out.size(), 3u) << out.dump();
  EXPECT_NE(out[0]["text"].get<std::string>().find("[kgate] 4 bytes of this output were cut"), std::string::npos);
  EXPECT_EQ(out[1]["text"], "E");
}

TEST(OutputStore, RichOutputsKeepEveryMimeTypeInOrder) {
  OutputStore s;
  s.stream("k", 1, false, 0, 6);
  s.message("k", 1, "display_data", display({{"image/png", "iVBOR"}, {"text/plain", "<Figure>"}}));
  s.message("k", 1, "execute_result",
            {{"data", {{"text/html", "<b>x</b>"}, {"text/plain", "x"}}}, {"metadata", json::object()}, {"execution_count", 3}});
  s.message("k", 1, "error", {{"ename", "ValueError"}, {"evalue", "bad"}, {"traceback", {"line 1"}}});
  s.message("k", 1, "status", {{"execution_state", "idle"}});  // not an output
  json out = s.nbformat(1, "hello\n", 0);
  ASSERT_EQ(out.size(), 4u) << out.dump();
  EXPECT_EQ(out[1]["output_type"], "display_data");
  EXPECT_EQ(out[1]["data"]["image/png"], "iVBOR");
  EXPECT_EQ(out[2]["output_type"], "execute_result");
  EXPECT_EQ(out[2]["execution_count"], 3);
  EXPECT_EQ(out[2]["data"]["text/html"], "<b>x</b>");
  EXPECT_EQ(out[3], json({{"output_type", "error"}, {"ename", "ValueError"}, {"evalue", "bad"}, {"traceback", {"line 1"}}}));
}

TEST(OutputStore, UpdateDisplayDataAppliesByDisplayIdAcrossCells) {
  OutputStore s;
  s.message("k", 1, "display_data", display({{"text/plain", "0%"}}, "bar"));
  s.message("k", 2, "display_data", display({{"text/plain", "other"}}, "other"));
  s.message("k", 2, "update_display_data", display({{"text/plain", "100%"}}, "bar"));
  s.message("j", 3, "update_display_data", display({{"text/plain", "wrong kernel"}}, "bar"));
  EXPECT_EQ(s.nbformat(1, "", 0)[0]["data"]["text/plain"], "100%");
  EXPECT_EQ(s.nbformat(2, "", 0)[0]["data"]["text/plain"], "other");
  s.drop(1);
  s.message("k", 2, "update_display_data", display({{"text/plain", "gone"}}, "bar"));  // nothing shows it
  EXPECT_FALSE(s.has(1));
}

TEST(OutputStore, ClearOutputNowAndAtTheNextOutput) {
  OutputStore s;
  s.stream("k", 1, false, 0, 3);
  s.message("k", 1, "clear_output", {{"wait", false}});
  EXPECT_TRUE(s.nbformat(1, "abc", 0).empty());
  // A clear_output(wait=True) loop: each step clears the one before, the last stays.
  for (int i = 0; i < 5; ++i) {
    s.message("k", 1, "clear_output", {{"wait", true}});
    s.message("k", 1, "display_data", display({{"text/plain", "step " + std::to_string(i)}}));
  }
  json out = s.nbformat(1, "abc", 0);
  ASSERT_EQ(out.size(), 1u) << out.dump();
  EXPECT_EQ(out[0]["data"]["text/plain"], "step 4");
  s.message("k", 1, "clear_output", {{"wait", true}});
  EXPECT_EQ(s.nbformat(1, "abc", 0).size(), 1u);  // nothing came after it yet
  s.stream("k", 1, false, 3, 5);
  out = s.nbformat(1, "abcde", 0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0]["text"], "de");
}

TEST(OutputStore, BigValuesGoToSharedFilesThatGoWithTheirLastOutput) {
  TempDir dir{"kgate-outputs"};
  OutputLimits lim;
  lim.inline_bytes = 16;
  OutputStore s(lim, dir.path() / "blobs");
  const std::string png(1000, 'P');
  s.message("k", 1, "display_data", display({{"image/png", png}, {"text/plain", "<Figure>"}}));
  s.message("k", 2, "display_data", display({{"image/png", png}}));  // the same bytes: one file
  s.message("k", 2, "display_data", display({{"application/json", {{"big", std::string(100, 'j')}}}}));
  EXPECT_EQ(s.blobs().count(), 2u);
  EXPECT_EQ(s.kernel_disk_bytes("k"), 2 * png.size() + json({{"big", std::string(100, 'j')}}).dump().size());
  std::size_t files = 0;
  for (auto& e : fs::directory_iterator(dir.path() / "blobs")) {
    ++files;
    struct stat st {};
    ASSERT_EQ(::stat(e.path().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u) << e.path();
  }
  EXPECT_EQ(files, 2u);
  struct stat dst {};
  ASSERT_EQ(::stat((dir.path() / "blobs").c_str(), &dst), 0);
  EXPECT_EQ(dst.st_mode & 0777, 0700u);
  json out = s.nbformat(2, "", 0);
  EXPECT_EQ(out[0]["data"]["image/png"], png);
  EXPECT_EQ(out[1]["data"]["application/json"]["big"], std::string(100, 'j'));
  EXPECT_EQ(s.nbformat(1, "", 0)[0]["data"]["text/plain"], "<Figure>");
  s.drop(1);
  EXPECT_EQ(s.blobs().count(), 2u);  // job 2 still shows the plot
  s.drop(2);
  EXPECT_EQ(s.blobs().count(), 0u);
  EXPECT_TRUE(fs::is_empty(dir.path() / "blobs"));
  EXPECT_EQ(s.kernel_disk_bytes("k"), 0u);
}

TEST(OutputStore, EveryLimitLeavesANote) {
  TempDir dir{"kgate-outputs"};
  OutputLimits lim;
  lim.inline_bytes = 10;
  lim.output_bytes = 100;
  lim.cell_bytes = 250;
  lim.kernel_disk_bytes = 400;
  OutputStore s(lim, dir.path() / "blobs");
  auto note_of = [&](std::uint64_t job, std::size_t i) { return s.nbformat(job, "", 0)[i]["text"].get<std::string>(); };
  s.message("k", 1, "display_data", display({{"image/png", std::string(101, 'a')}}));
  EXPECT_NE(note_of(1, 0).find("[kgate] A display_data of 101 bytes (image/png) was not kept: past the limit of one "
                               "output (100 bytes, [records] output_bytes)"),
            std::string::npos)
      << note_of(1, 0);
  // The cell's limit: 3 x 90 > 250; the third is dropped, and one note says so for the rest.
  for (int i = 0; i < 4; ++i) s.message("k", 2, "display_data", display({{"image/png", std::string(90, char('b' + i))}}));
  json out = s.nbformat(2, "", 0);
  ASSERT_EQ(out.size(), 3u) << out.dump();
  EXPECT_NE(out[2]["text"].get<std::string>().find("past the limit of one cell's outputs"), std::string::npos);
  // The kernel's disk: 180 bytes on disk from job 2; jobs 3 and 4 bring 90 each (fits: 360), job
  // 5's 90 would make 450 > 400.
  for (int i = 0; i < 3; ++i) s.message("k", 3 + i, "display_data", display({{"image/png", std::string(90, char('m' + i))}}));
  EXPECT_EQ(s.nbformat(4, "", 0)[0]["output_type"], "display_data");
  out = s.nbformat(5, "", 0);
  ASSERT_EQ(out.size(), 1u) << out.dump();
  EXPECT_NE(out[0]["text"].get<std::string>().find("this kernel's outputs on disk reached their limit"), std::string::npos)
      << out.dump();
  EXPECT_LE(s.kernel_disk_bytes("k"), lim.kernel_disk_bytes);
  // Another kernel has its own budget.
  s.message("j", 6, "display_data", display({{"image/png", std::string(90, 'z')}}));
  EXPECT_EQ(s.nbformat(6, "", 0)[0]["output_type"], "display_data");
}

// What a record on disk keeps of its outputs, read back by a later kgate: the same outputs, the
// files held again, and the files no record names removed.
// What the outputs hold in memory (counted against the records' budget) follows them: an
// updated display counts once however often it is updated, and a dropped job gives all back.
TEST(OutputStore, MemoryFollowsUpdatesClearsAndDrops) {
  OutputStore s;
  s.message("k", 1, "display_data", display({{"text/plain", "0%"}}, "bar"));
  const std::size_t one = s.memory_bytes();
  EXPECT_GT(one, 0u);
  for (int i = 0; i < 1000; ++i) s.message("k", 1, "update_display_data", display({{"text/plain", "5%"}}, "bar"));
  EXPECT_EQ(s.memory_bytes(), one);
  s.message("k", 1, "error", {{"ename", "E"}, {"evalue", "v"}, {"traceback", json::array()}});
  s.message("k", 1, "clear_output", {{"wait", false}});
  EXPECT_EQ(s.memory_bytes(), 0u);
  s.message("k", 2, "display_data", display({{"text/plain", "x"}}));
  s.drop(2);
  EXPECT_EQ(s.memory_bytes(), 0u);
}

TEST(OutputStore, SavedAndLoadedByALaterKgate) {
  TempDir dir{"kgate-outputs"};
  OutputLimits lim;
  lim.inline_bytes = 16;
  json saved1, saved2, before;
  {
    OutputStore s(lim, dir.path());
    s.stream("k", 1, false, 0, 3);
    s.message("k", 1, "display_data", display({{"image/png", std::string(500, 'p')}}, "fig"));
    s.stream("k", 1, true, 3, 5);
    s.message("k", 2, "display_data", display({{"image/png", std::string(400, 'q')}}));
    saved1 = s.save(1);
    saved2 = s.save(2);
    before = s.nbformat(1, "abcde", 0);
  }
  ASSERT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 2);
  std::ofstream(dir.path() / ".half-written.tmp") << "x";
  OutputStore later(lim, dir.path());
  later.load("k", 1, json::parse(saved1.dump()));  // job 2's record did not come back
  EXPECT_EQ(later.collect(), 2u);                    // job 2's file and the unfinished write
  EXPECT_EQ(later.nbformat(1, "abcde", 0), before);
  EXPECT_EQ(later.kernel_disk_bytes("k"), 500u);
  later.message("k", 3, "update_display_data", display({{"text/plain", "updated"}}, "fig"));
  EXPECT_EQ(later.nbformat(1, "abcde", 0)[1]["data"]["text/plain"], "updated");
  // A file gone meanwhile: a note in the value's place, not a failure.
  OutputStore third(lim, dir.path() / "elsewhere");
  third.load("k", 2, saved2);
  EXPECT_EQ(third.nbformat(2, "", 0)[0]["data"]["image/png"], "[kgate] this value's file is gone");
}

TEST(BlobStore, InMemoryWithoutADirectoryAndHeldBackFromDisk) {
  BlobStore mem;
  const std::string id = mem.put("hello");
  EXPECT_EQ(id.size(), 64u);
  EXPECT_EQ(mem.put("hello"), id);
  EXPECT_EQ(mem.get(id), "hello");
  mem.release(id);
  EXPECT_EQ(mem.get(id), "hello");
  mem.release(id);
  EXPECT_FALSE(mem.get(id).has_value());

  TempDir dir{"kgate-blobs"};
  std::string kept;
  {
    BlobStore disk(dir.path());
    kept = disk.put("plot bytes");
  }
  BlobStore later(dir.path());  // a later kgate: the file is there, held again by id
  EXPECT_FALSE(later.hold("../../etc/passwd"));
  EXPECT_FALSE(later.hold(std::string(64, 'f')));
  ASSERT_TRUE(later.hold(kept));
  EXPECT_EQ(later.get(kept), "plot bytes");
  EXPECT_EQ(later.bytes(), 10u);
  later.release(kept);
  EXPECT_FALSE(fs::exists(dir.path() / kept));
}

}  // namespace
}  // namespace kgate
