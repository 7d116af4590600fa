# Writes one man page at build time (cmake -P; cmake/ManPages.cmake calls it), from what the
# programs and the sample config say, so the pages cannot drift from them:
#   WHAT=program  help2man on BIN's --help, with every subcommand's --help as a section
#   WHAT=config   the sample kgate.toml (SRC), whole, under a short description
# Arguments: -DWHAT= -DBIN= (program) -DSRC= (config) -DOUT= -DVERSION= -DNAME= (the NAME line)

# Roff-safe text: backslashes escaped, and no line that starts with a control character.
function(roff_text in out)
  string(REPLACE "\\" "\\e" t "${in}")
  string(REGEX REPLACE "(^|\n)([.'])" "\\1\\\\&\\2" t "${t}")
  set(${out} "${t}" PARENT_SCOPE)
endfunction()

get_filename_component(out_dir "${OUT}" DIRECTORY)
file(MAKE_DIRECTORY "${out_dir}")

if(WHAT STREQUAL "program")
  get_filename_component(bin_dir "${BIN}" DIRECTORY)
  get_filename_component(prog "${BIN}" NAME)
  # Run as `prog`, found on PATH, so the usage lines name it and not the build folder.
  set(ENV{PATH} "${bin_dir}:$ENV{PATH}")
  execute_process(COMMAND ${prog} --help OUTPUT_VARIABLE top RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${prog} --help failed (${rc})")
  endif()
  set(include "")
  # The subcommands: the lines under "Subcommands:", two spaces then a name.
  string(FIND "${top}" "Subcommands:" at)
  if(NOT at EQUAL -1)
    string(SUBSTRING "${top}" ${at} -1 subs)
    string(REGEX MATCHALL "\n  [a-z][a-z-]*" names "${subs}")
    set(include "[COMMANDS]\n")
    foreach(n IN LISTS names)
      string(STRIP "${n}" n)
      execute_process(COMMAND ${prog} ${n} --help OUTPUT_VARIABLE help RESULT_VARIABLE rc)
      if(NOT rc EQUAL 0)
        message(FATAL_ERROR "${prog} ${n} --help failed (${rc})")
      endif()
      roff_text("${help}" help)
      string(APPEND include ".SS ${prog} ${n}\n.nf\n${help}.fi\n")
    endforeach()
  endif()
  string(APPEND include "[SEE ALSO]\n${SEE_ALSO}\n")
  file(WRITE "${OUT}.include" "${include}")
  execute_process(COMMAND help2man --no-info "--version-string=${VERSION}" "--name=${NAME}"
                          "--include=${OUT}.include" "--output=${OUT}" ${prog}
                  RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "help2man ${prog} failed (${rc}): ${err}")
  endif()
elseif(WHAT STREQUAL "config")
  file(READ "${SRC}" sample)
  roff_text("${sample}" sample)
  file(WRITE "${OUT}" ".TH KGATE.TOML 5 \"\" \"kgate ${VERSION}\" \"File Formats\"
.SH NAME
kgate.toml \\- ${NAME}
.SH SYNOPSIS
\\fI$XDG_CONFIG_HOME/kgate/kgate.toml\\fR (\\fI~/.config/kgate/kgate.toml\\fR), or \\fBkgate serve \\-\\-config\\fR \\fIFILE\\fR
.SH DESCRIPTION
\\fBkgate serve\\fR reads its settings from this TOML file; flags on its command line override
it, and an unknown key is an error.  \\fBkill \\-HUP\\fR reloads what can change while kgate
runs (tokens, limits, culling, the pool sizes).  The sample below is the one kgate is built with:
every key, its default and what it does.  It is installed as
\\fIshare/doc/kgate/examples/kgate.toml\\fR under kgate's prefix.
.SH THE SAMPLE FILE
.nf
${sample}.fi
.SH SEE ALSO
\\fBkgate\\fR(1), \\fBkgate-mcp\\fR(1)
")
else()
  message(FATAL_ERROR "make_man.cmake: WHAT must be program or config")
endif()
