	leaq	(%rsi,%r11), %r14
	vpbroadcastd	(%r14,%rax,4), %zmm16
	vpbroadcastd	(%r14,%rax,8), %zmm15
	addq	%r9, %r14
	addq	%r9, %r14
	vpbroadcastd	(%r14,%rax,4), %zmm5
	vpbroadcastd	(%r14,%rax,8), %zmm0
	vmovdqu64	-8384(%r8), %zmm2
	vmovdqu64	-8320(%r8), %zmm6
	vmovdqu64	-8256(%r8), %zmm7
	vmovdqu64	-8192(%r8), %zmm20
	leaq	(%rcx,%r11,8), %r14
	vpandq	%zmm29, %zmm2, %zmm4
	vgf2p8affineqb	$0, %zmm30, %zmm2, %zmm3
	vpdpbusd	-28(%r10,%r14){1to16}, %zmm4, %zmm16
	vxorps	%xmm19, %xmm19, %xmm19
	vpdpbusd	-12(%r10,%r14){1to16}, %zmm3, %zmm19
	vpandq	%zmm29, %zmm6, %zmm8
	vgf2p8affineqb	$0, %zmm30, %zmm6, %zmm9
	vpdpbusd	-24(%r10,%r14){1to16}, %zmm8, %zmm16
	vpdpbusd	-8(%r10,%r14){1to16}, %zmm9, %zmm19
	vpandq	%zmm29, %zmm7, %zmm17
	vgf2p8affineqb	$0, %zmm30, %zmm7, %zmm18
	vpdpbusd	-20(%r10,%r14){1to16}, %zmm17, %zmm16
	vpdpbusd	-4(%r10,%r14){1to16}, %zmm18, %zmm19
	vpandq	%zmm29, %zmm20, %zmm21
	vgf2p8affineqb	$0, %zmm30, %zmm20, %zmm20
	vpdpbusd	-16(%r10,%r14){1to16}, %zmm21, %zmm16
	vpdpbusd	(%r10,%r14){1to16}, %zmm20, %zmm19
	leaq	-28(%r10,%r14), %r14
	vpdpbusd	(%r10,%r14){1to16}, %zmm4, %zmm15
	vpxor	%xmm2, %xmm2, %xmm2
	vpdpbusd	16(%r10,%r14){1to16}, %zmm3, %zmm2
	vpdpbusd	4(%r10,%r14){1to16}, %zmm8, %zmm15
	vpdpbusd	20(%r10,%r14){1to16}, %zmm9, %zmm2
	vpdpbusd	8(%r10,%r14){1to16}, %zmm17, %zmm15
	vpdpbusd	24(%r10,%r14){1to16}, %zmm18, %zmm2
	vpdpbusd	12(%r10,%r14){1to16}, %zmm21, %zmm15
	vpdpbusd	28(%r10,%r14){1to16}, %zmm20, %zmm2
	leaq	(%r14,%r10), %r14
	vpdpbusd	(%r10,%r14){1to16}, %zmm4, %zmm5
	vpxor	%xmm6, %xmm6, %xmm6
	vpdpbusd	16(%r10,%r14){1to16}, %zmm3, %zmm6
	vpdpbusd	4(%r10,%r14){1to16}, %zmm8, %zmm5
	vpdpbusd	20(%r10,%r14){1to16}, %zmm9, %zmm6
	vpdpbusd	8(%r10,%r14){1to16}, %zmm17, %zmm5
	vpdpbusd	24(%r10,%r14){1to16}, %zmm18, %zmm6
	vpdpbusd	12(%r10,%r14){1to16}, %zmm21, %zmm5
	vpdpbusd	28(%r10,%r14){1to16}, %zmm20, %zmm6
	leaq	(%r14,%r10), %r14
	vpdpbusd	(%r10,%r14){1to16}, %zmm4, %zmm0
	vpaddd	%zmm16, %zmm19, %zmm7
	vpxord	%xmm16, %xmm16, %xmm16
	vpdpbusd	16(%r10,%r14){1to16}, %zmm3, %zmm16
	vpdpbusd	4(%r10,%r14){1to16}, %zmm8, %zmm0
	vpdpbusd	20(%r10,%r14){1to16}, %zmm9, %zmm16
	vpdpbusd	8(%r10,%r14){1to16}, %zmm17, %zmm0
	vpdpbusd	24(%r10,%r14){1to16}, %zmm18, %zmm16
	vpaddd	%zmm15, %zmm2, %zmm2
	vpdpbusd	12(%r10,%r14){1to16}, %zmm21, %zmm0
	vpdpbusd	28(%r10,%r14){1to16}, %zmm20, %zmm16
	leaq	(%rdx,%r11), %r14
	vcvtdq2ps	%zmm7, %zmm7
	vmulps	(%r14,%rax,4){1to16}, %zmm7, %zmm7
	vcvtdq2ps	%zmm2, %zmm2
	vmulps	(%r14,%rax,8){1to16}, %zmm2, %zmm2
	vpaddd	%zmm5, %zmm6, %zmm5
	addq	%r9, %r14
	addq	%r9, %r14
	vcvtdq2ps	%zmm5, %zmm5
	vmulps	(%r14,%rax,4){1to16}, %zmm5, %zmm5
	vpaddd	%zmm0, %zmm16, %zmm0
	vcvtdq2ps	%zmm0, %zmm0
	vmulps	(%r14,%rax,8){1to16}, %zmm0, %zmm0
	prefetcht1	-192(%r8)
	prefetcht1	-128(%r8)
	prefetcht1	-64(%r8)
	vpbroadcastd	(%rsi,%r11), %zmm6
	vpdpbusd	-28(%rcx,%r11,8){1to16}, %zmm4, %zmm6
	vpxor	%xmm4, %xmm4, %xmm4
	vpdpbusd	-12(%rcx,%r11,8){1to16}, %zmm3, %zmm4
	vpdpbusd	-24(%rcx,%r11,8){1to16}, %zmm8, %zmm6
	vpdpbusd	-8(%rcx,%r11,8){1to16}, %zmm9, %zmm4
	vpdpbusd	-20(%rcx,%r11,8){1to16}, %zmm17, %zmm6
	vpdpbusd	-4(%rcx,%r11,8){1to16}, %zmm18, %zmm4
	vpdpbusd	-16(%rcx,%r11,8){1to16}, %zmm21, %zmm6
	prefetcht1	(%r8)
	vpdpbusd	(%rcx,%r11,8){1to16}, %zmm20, %zmm4
	vpaddd	%zmm6, %zmm4, %zmm3
	vpmovzxwd	(%r15,%r11,8), %zmm4
	vpslld	$16, %zmm4, %zmm4
	vcvtdq2ps	%zmm3, %zmm3
	vmulps	(%rdx,%r11){1to16}, %zmm3, %zmm3
	vfmadd231ps	%zmm3, %zmm4, %zmm10
	vfmadd231ps	%zmm7, %zmm4, %zmm11
	vfmadd231ps	%zmm2, %zmm4, %zmm12
	vfmadd231ps	%zmm5, %zmm4, %zmm13
	vfmadd231ps	%zmm0, %zmm4, %zmm14
	addq	$4, %r11
	addq	%r13, %r8
	decq	%rdi
	jne	.LBB6_232
