# cmake -DIN=file -DOUT=file.c -DNAME=symbol [-DHEADER=x.h] -P EmbedFile.cmake: writes a C file holding
# IN's bytes as `const unsigned char NAME[]` (NUL-terminated) and `const size_t NAME_len`,
# so text such as coordinator/page.html stays a readable file of its own in the tree.
# -DHEADER=path/x.h (optional): included first, so the compiler checks its declarations
set(include "")
if(HEADER)
  set(include "#include \"${HEADER}\"\n")
endif()
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n_hex)
math(EXPR n "${n_hex} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "((0x..,){16})" "\\1\n    " bytes "${bytes}")
file(WRITE "${OUT}"
     "/* generated from ${IN} by cmake/EmbedFile.cmake: edit that file, not this one */\n"
     "#include <stddef.h>\n${include}\n"
     "const unsigned char ${NAME}[] = {\n    ${bytes}0x00};\n"
     "const size_t ${NAME}_len = ${n};\n")
