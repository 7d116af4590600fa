#!/usr/bin/env python3
"""The build's structure, from compile_commands.json and the sources (ctest: build_structure).

Fails (exit 1, naming each offence) when:
  1. a translation unit of the project is compiled without include/kgate/beast_config.hpp forced
     first: two definitions of Beast's websocket stream would then meet in one binary;
  2. a source file is compiled into more than one target;
  3. gateway/ includes anything from translator/, or translator/ from gateway/ (both use the
     libraries under include/kgate/ and src/ only);
  4. a file other than src/client/websocket_impl.hpp includes Beast's websocket stream
     (<boost/beast/websocket.hpp>, or .../websocket/stream.hpp or ssl.hpp), or a unit other than
     src/client/websocket*.cpp includes websocket_impl.hpp or websocket_ops.hpp: the stream's
     state machines are compiled there, once per transport, and nowhere else (compile time: each
     unit that instantiated them took 60-100 s);
  5. a source or header under include/, src/, gateway/ or translator/ is over MAX_LINES lines;
  6. a file includes a library's header from a layer it may not use (LAYERS below, the one list
     of the libraries and what each may include; DEV.md §1 draws it);
  7. kgate-mcp links the kernel runtime (kgate_kernel, or libzmq): it is a client of a gateway;
  8. an MCP tool's name is written outside its row of the one table (translator/mcp/
     tool_table.cpp, Translator::tools()): tools/list and tools/call are both read from it;
  9. a file of gateway/ includes one of gateway/'s headers from a room it may not use
     (GATEWAY_ROOMS below; DEV.md §2 draws them): the handlers see the daemon only through
     services.hpp, and the transport (http/) sees no handler.
Usage: check_build.py BUILD/compile_commands.json SOURCE_DIR
"""
import json
import re
import shlex
import sys
from collections import defaultdict
from pathlib import Path


# A file past this is split by concern (as src/kernel/ is, behind kernel_impl.hpp).
MAX_LINES = 1000

# The layers, lowest first: each may include the headers of the layers it lists, and its own.
# A library's headers are include/kgate/<layer>/; its sources src/<layer>/ (translator/mcp/ for
# mcp).  gateway/ and translator/main.cpp are the programs on top.
LAYERS = {
    "jupyter": set(),
    "process": {"jupyter"},
    "discovery": {"jupyter", "process"},
    "kernel": {"jupyter", "process"},
    "records": {"jupyter", "process", "kernel"},
    "client": {"jupyter"},
    "mcp": {"jupyter", "client"},
    "translator": {"jupyter", "client", "mcp"},
    "gateway": {"jupyter", "process", "discovery", "kernel", "records", "client", "mcp"},
}


# gateway/'s rooms, lowest first, and the rooms each may include besides its own.  A file's room
# is its folder (http/, ws/, api/, cli/), else the one named for it in GATEWAY_FILES.
GATEWAY_ROOMS = {
    "options": set(),                                             # options.hpp: plain settings
    "http": {"options"},                                          # the transport
    "config": {"options", "http"},                                # kgate.toml; systemd.cpp
    "contract": {"options", "http"},                              # services.hpp, handlers.hpp
    "ws": {"options", "http", "contract"},                        # the websockets, the hub
    "stores": {"options", "http", "contract"},                    # the warm pool, the sessions
    "api": {"options", "http", "contract", "ws", "stores"},       # the REST handlers, /mcp
    "daemon": {"options", "http", "config", "contract", "ws", "stores", "api"},  # server, routes
    "cli": {"options", "http", "config", "contract", "ws", "stores", "api", "daemon"},
}
GATEWAY_FILES = {
    "options": "options", "config": "config", "systemd": "config", "services": "contract",
    "handlers": "contract", "pool": "stores", "sessions": "stores", "server": "daemon", "routes": "daemon",
}


def gateway_room(rel: Path):
    """The room of gateway/<rel>, None for a file of no room (a page, a build file)."""
    if len(rel.parts) > 1:
        return rel.parts[0] if rel.parts[0] in GATEWAY_ROOMS else None
    return GATEWAY_FILES.get(rel.stem)


def check_gateway_rooms(src: Path, problems: list) -> None:
    include_re = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
    gw = src / "gateway"
    for f in sorted(gw.rglob("*.[ch]pp")):
        rel = f.relative_to(gw)
        mine = gateway_room(rel)
        if mine is None:
            problems.append(f"gateway/{rel}: in no room of GATEWAY_ROOMS: give it one")
            continue
        for inc in include_re.findall(f.read_text(errors="replace")):
            if not (gw / inc).is_file():
                continue  # a library's header, or a generated one
            theirs = gateway_room(Path(inc))
            if theirs != mine and theirs not in GATEWAY_ROOMS[mine]:
                problems.append(f"gateway/{rel}: includes {inc} ({theirs}) from room {mine}, "
                                f"which may use {sorted(GATEWAY_ROOMS[mine]) or 'no other room'}")


def layer_of(rel: Path):
    parts = rel.parts
    if parts[:2] == ("include", "kgate") and len(parts) > 3:
        return parts[2]
    if parts[0] == "src" and len(parts) > 2 and parts[1] in LAYERS:
        return parts[1]
    if parts[:2] == ("translator", "mcp"):
        return "mcp"
    if parts[0] in ("translator", "gateway"):
        return parts[0]
    return None


def check_sizes_and_layers(src: Path, problems: list) -> None:
    include_re = re.compile(r'^\s*#\s*include\s*"kgate/([a-z_]+)/[^"]+"', re.M)
    for d in ("include", "src", "gateway", "translator"):
        for f in sorted((src / d).rglob("*.[ch]pp")):
            rel = f.relative_to(src)
            text = f.read_text(errors="replace")
            lines = text.count("\n")
            if lines > MAX_LINES:
                problems.append(f"{rel}: {lines} lines, over {MAX_LINES}: split it by concern")
            mine = layer_of(rel)
            if mine is None:
                continue
            for lib in include_re.findall(text):
                if lib in LAYERS and lib != mine and lib not in LAYERS[mine]:
                    problems.append(f"{rel}: includes kgate/{lib}/ from layer {mine}, which may use {sorted(LAYERS[mine]) or 'no other layer'}")


def check_mcp_link(build: Path, problems: list) -> None:
    ninja = build / "build.ninja"
    if not ninja.exists():
        return  # another generator: the rule is checked by Ninja builds (every script's)
    text = ninja.read_text(errors="replace")
    m = re.search(r"^build translator/kgate-mcp:.*?(?=^build |\Z)", text, re.M | re.S)
    if not m:
        problems.append(f"{ninja}: no link of translator/kgate-mcp")
        return
    for bad in ("libkgate_kernel.a", "libzmq", "-lzmq"):
        if bad in m.group(0):
            problems.append(f"kgate-mcp links {bad}: it must not carry the kernel runtime")


TOOL_TABLE = Path("translator/mcp/tool_table.cpp")


def check_tool_table(src: Path, problems: list) -> None:
    text = (src / TOOL_TABLE).read_text(errors="replace")
    body = text[text.find("static const std::vector<Tool> table = {"):]
    names = re.findall(r'^\s*\{"([a-z_]+)", "[^"]*", \{', body, re.M)
    if not names:
        problems.append(f"{TOOL_TABLE}: no table of tools found")
        return
    for name in names:  # a tool listed twice is written twice
        if len(re.findall(r'"' + name + r'"', text)) != 1:
            problems.append(f"{TOOL_TABLE}: \"{name}\" is written more than once: one row per tool")
    # The MCP code: kgate_mcp, kgate-mcp and kgate's /mcp (elsewhere "restart" is a REST path).
    files = [*(f for f in (src / "translator").rglob("*.[ch]pp") if f != src / TOOL_TABLE),
             *(src / "include/kgate/mcp").rglob("*.hpp"),
             *(src / "gateway/api").glob("mcp_http.[ch]pp")]
    for f in sorted(files):
        t = f.read_text(errors="replace")
        for name in names:
            if re.search(r'"' + name + r'"', t):
                problems.append(f"{f.relative_to(src)}: names the tool \"{name}\" outside the table ({TOOL_TABLE})")


def main() -> int:
    db_path, src = Path(sys.argv[1]), Path(sys.argv[2]).resolve()
    db = json.loads(db_path.read_text())
    forced = str(src / "include" / "kgate" / "beast_config.hpp")
    problems = []
    targets = defaultdict(set)
    for entry in db:
        file = Path(entry["directory"], entry["file"]).resolve()
        if src not in file.parents:
            continue
        args = entry.get("arguments") or shlex.split(entry["command"])
        rel = file.relative_to(src)
        includes = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "-include"]
        if forced not in includes:
            problems.append(f"{rel}: compiled without -include {forced} (one Beast configuration: cmake/Beast.cmake)")
        out = args[args.index("-o") + 1] if "-o" in args else entry.get("output", "")
        m = re.search(r"CMakeFiles/([^/]+)\.dir/", out)
        targets[rel].add(m.group(1) if m else out)
        for flag in args:
            if flag.startswith("-I"):
                inc = Path(flag[2:]).resolve()
                for a, b in (("gateway", "translator"), ("translator", "gateway")):
                    if rel.parts[0] == a and inc == src / b:
                        problems.append(f"{rel}: compiled with {b}/ on its include path")
    for rel, ts in sorted(targets.items()):
        if len(ts) > 1:
            problems.append(f"{rel}: compiled into {len(ts)} targets ({', '.join(sorted(ts))})")
    if not targets:
        problems.append(f"{db_path}: no translation unit of {src}")
    include_re = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
    for a, b in (("gateway", "translator"), ("translator", "gateway")):
        theirs = {p.name for p in (src / b).glob("*.[ch]pp")}
        mine = {p.name for p in (src / a).glob("*.[ch]pp")}
        for f in sorted((src / a).rglob("*.[ch]pp")):
            for inc in include_re.findall(f.read_text(errors="replace")):
                if f"{b}/" in inc or (inc in theirs and inc not in mine):
                    problems.append(f"{f.relative_to(src)}: includes {inc} from {b}/")
    stream_re = re.compile(r'^\s*#\s*include\s*<boost/beast/websocket(\.hpp|/stream\.hpp|/ssl\.hpp)>', re.M)
    impl_re = re.compile(r'^\s*#\s*include\s*"(websocket_impl|websocket_ops)\.hpp"', re.M)
    for f in sorted(p for d in ("include", "src", "gateway", "translator", "tests", "bench") for p in (src / d).rglob("*.[ch]pp")):
        rel = f.relative_to(src)
        text = f.read_text(errors="replace")
        if stream_re.search(text) and str(rel) not in ("src/client/websocket_impl.hpp", "src/beast/boost_impl.cpp"):
            problems.append(f"{rel}: includes Beast's websocket stream (use kgate/client/websocket.hpp)")
        m = impl_re.search(text)
        if m and not (rel.parent == Path("src/client") and rel.name.startswith("websocket")):
            problems.append(f"{rel}: includes {m.group(1)}.hpp (only src/client/websocket*.cpp compile the stream)")
    check_sizes_and_layers(src, problems)
    check_mcp_link(db_path.parent, problems)
    check_tool_table(src, problems)
    check_gateway_rooms(src, problems)
    for p in problems:
        print(p)
    print(f"check_build: {len(targets)} translation units, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
