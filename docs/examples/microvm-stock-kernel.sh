#!/bin/sh
# A Linux guest for QEMU's microvm machine, from Debian 12's own packages: the cloud kernel
# (linux-image-cloud-amd64: the 8250 serial console built in, virtio as modules) and an
# initramfs of busybox-static whose /init prints a marker and ends the VM. Needs apt-get
# that reaches Debian's archive (a Debian 12 build stage, say), gzip and dpkg-deb; no root.
#
#   sh docs/examples/microvm-stock-kernel.sh OUT_DIR      # OUT_DIR/vmlinuz, OUT_DIR/initrd.gz
#
# Boot it on hardware KVM (docs/microvm-workers.md; tests/e2e/test_stock_kernel.py runs this
# script and this command in an unprivileged pod); QEMU exits 0 when the guest reboots:
#
#   qemu-system-x86_64 -M microvm,x-option-roms=off,rtc=on -accel kvm -cpu host -m 256M \
#     -nodefaults -no-user-config -display none -serial stdio -no-reboot \
#     -kernel OUT_DIR/vmlinuz -initrd OUT_DIR/initrd.gz -append "console=ttyS0 reboot=t panic=-1"
set -eu
out=${1:?usage: microvm-stock-kernel.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

# The metapackage names the kernel of the current point release.
kernel=$(apt-cache depends linux-image-cloud-amd64 | sed -n 's/^ *Depends: \(linux-image-[0-9].*\)$/\1/p' | head -n 1)
apt-get download "$kernel" busybox-static >/dev/null
dpkg-deb -x "$kernel"_*.deb kernel
dpkg-deb -x busybox-static_*.deb busybox
cp kernel/boot/vmlinuz-* "$out/vmlinuz"

mkdir -p initramfs/bin
cp busybox/bin/busybox initramfs/bin/busybox
cat >initramfs/init <<'EOF'
#!/bin/busybox sh
/bin/busybox echo "ate guest: Linux $(/bin/busybox uname -r) booted"
/bin/busybox reboot -f
EOF
chmod 0755 initramfs/init
(cd initramfs && ../busybox/bin/busybox find . | ../busybox/bin/busybox cpio -o -H newc) 2>/dev/null \
    | gzip -9 >"$out/initrd.gz"
echo "microvm-stock-kernel.sh: $out/vmlinuz ($kernel), $out/initrd.gz (busybox-static)"
