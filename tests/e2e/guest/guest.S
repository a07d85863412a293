/*
 * The e2e suite's guest: a freestanding 32-bit multiboot kernel that QEMU's -kernel loads
 * (-M pc). It prints a marker on COM1, looks for a virtio device (vendor 0x1af4) on PCI bus
 * 0 through the configuration ports 0xcf8/0xcfc and prints what it found, then writes a
 * code to QEMU's isa-debug-exit port 0xf4: QEMU exits with (code << 1) | 1, 67 when a
 * virtio device was there, 65 when not. Every step is a port I/O exit to the VMM.
 */
        .set MB_MAGIC, 0x1BADB002
        .set MB_FLAGS, 0
        .set COM1, 0x3f8
        .set PCI_ADDRESS, 0xcf8
        .set PCI_DATA, 0xcfc
        .set VIRTIO_VENDOR, 0x1af4
        .set DEBUG_EXIT, 0xf4

        .section .multiboot, "a"
        .align 4
        .long MB_MAGIC, MB_FLAGS, -(MB_MAGIC + MB_FLAGS)

        .text
        .code32
        .globl _start
_start:
        cli
        mov $stack_top, %esp
        mov $marker, %esi
        call puts
        xor %ebx, %ebx                  /* slot number */
scan:
        mov %ebx, %eax
        shl $11, %eax
        or $0x80000000, %eax            /* enable bit, bus 0, function 0, register 0 */
        mov $PCI_ADDRESS, %dx
        out %eax, %dx
        mov $PCI_DATA, %dx
        in %dx, %eax                    /* device id << 16 | vendor id */
        cmp $VIRTIO_VENDOR, %ax
        je found
        inc %ebx
        cmp $32, %ebx
        jb scan
        mov $none, %esi
        call puts
        mov $0x20, %al                  /* QEMU exits (0x20 << 1) | 1 = 65 */
        jmp leave
found:
        mov %eax, %edi
        mov $nic, %esi
        call puts
        mov %edi, %eax
        shr $16, %eax
        call hex16                      /* the device id */
        mov $slot, %esi
        call puts
        mov %ebx, %eax
        call hex16
        mov $newline, %esi
        call puts
        mov $0x21, %al                  /* QEMU exits (0x21 << 1) | 1 = 67 */
leave:
        out %al, $DEBUG_EXIT
halt:
        hlt
        jmp halt

/* Write the NUL-terminated string at %esi to COM1. */
puts:
        mov $COM1, %dx
1:      lodsb
        test %al, %al
        jz 2f
        out %al, %dx
        jmp 1b
2:      ret

/* Write %ax as four hex digits to COM1. */
hex16:
        mov %eax, %ecx
        mov $4, %ebp
1:      rol $4, %cx
        mov %cl, %al
        and $0xf, %al
        add $'0', %al
        cmp $'9', %al
        jbe 2f
        add $('a' - '9' - 1), %al
2:      mov $COM1, %dx
        out %al, %dx
        dec %ebp
        jnz 1b
        ret

        .section .rodata
marker:  .asciz "ate-e2e guest: booted\n"
nic:     .asciz "ate-e2e guest: virtio device 1af4:"
slot:    .asciz " on PCI bus 0, slot 0x"
none:    .asciz "ate-e2e guest: no virtio device on PCI bus 0\n"
newline: .asciz "\n"

        .bss
        .align 16
        .skip 4096
stack_top:
