# wrap.awk — writes the C++ file through which the CUDA emulator compiles
# one kernel file (tests/kernels/emu/emu.mk; docs/cuda.md, "CPU emulation
# of the kernels"): the .cu itself, then one KVT_EMU_BOUNDS line per
# __launch_bounds__ in it.  g++ has no use for launch bounds, and emu.h can
# only make the qualifier vanish, so this is how the emulator learns the
# bound it checks each launch against.  After the #include the file's own
# macros (PA_THREADS, ...) are in scope, so the bound is whatever
# expression the kernel wrote; only its first argument (max threads per
# block) is taken.
#
#   awk -f tests/kernels/emu/wrap.awk kernels/cuda/x.cu > x.cc

{ src = src $0 "\n" }

END {
	s = strip_comments(src)
	printf "/* generated from %s by tests/kernels/emu/wrap.awk */\n", \
	    FILENAME
	printf "#include \"%s\"\n", FILENAME
	key = "__launch_bounds__"
	while ((i = index(s, key)) > 0) {
		s = substr(s, i + length(key))
		if (!match(s, /^[ \t\n]*\(/))
			continue
		s = substr(s, RLENGTH + 1)
		# the first argument, up to a comma or the closing paren
		depth = 1; arg = ""; first = ""; j = 1
		while (j <= length(s)) {
			c = substr(s, j, 1)
			if (c == "(")
				depth++
			else if (c == ")" && --depth == 0)
				break
			else if (c == "," && depth == 1 && first == "")
				first = arg
			arg = arg c
			j++
		}
		bound = first != "" ? first : arg
		s = substr(s, j + 1)
		if (!match(s, /^[ \t\n]*[A-Za-z_][A-Za-z_0-9]*/))
			continue
		name = substr(s, RSTART, RLENGTH)
		gsub(/[ \t\n]/, "", name)
		gsub(/\n/, " ", bound)
		printf "KVT_EMU_BOUNDS(\"%s\", %s, %s);\n", FILENAME, name, \
		    bound
	}
}

# The source without /* */ and // comments (string literals in kernel
# files do not contain comment markers).
function strip_comments(t,    out, k, n, c, d) {
	out = ""
	n = length(t)
	for (k = 1; k <= n; k++) {
		c = substr(t, k, 1)
		d = substr(t, k, 2)
		if (d == "/*") {
			k += 2
			while (k <= n && substr(t, k, 2) != "*/")
				k++
			k++
			out = out " "
		} else if (d == "//") {
			while (k <= n && substr(t, k, 1) != "\n")
				k++
			out = out "\n"
		} else {
			out = out c
		}
	}
	return out
}
