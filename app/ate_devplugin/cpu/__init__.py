"""x86 CPUs as data: the named CPUID feature bits, the CPU profile a node records, restore
profiles and the decision between them, Firecracker's CPU templates. Pure and standard
library only: the KVM probe's child process and the config both read it."""
